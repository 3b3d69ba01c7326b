"""The storage conformance suite again, against a 3-master Valkey cluster (``cluster=True``).

The tests are the ones of tests/conformance/test_storage*.py, test_priorities.py, test_lease_loss.py,
test_pause.py, test_flows.py, test_groups.py, test_steps.py, test_sleep.py, test_signals.py and more, imported here; this
module's ``storage`` fixture overrides the parametrised one so they run once, on the cluster.
The tests are the ones of tests/conformance/test_storage*.py, test_priorities.py, test_lease_loss.py, test_dependencies.py,
test_pause.py, test_flows.py, test_groups.py, test_steps.py and more, imported here; this module's ``storage`` fixture overrides the
parametrised one so they run once, on the cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest


from test_storage import *  # noqa: E402,F403 - the conformance tests themselves
from test_storage_leases import *  # noqa: E402,F403 - (workers, leases, attempts)
from test_storage_events import *  # noqa: E402,F403 - (the event stream)
from test_storage_features import *  # noqa: E402,F403 - (delayed jobs, pause, progress, schedules)
from test_admin import *  # noqa: E402,F403 - and those of job listing and administration
from test_flow_control import *  # noqa: E402,F403 - flow control (rate limit, concurrency)
from test_metrics import test_storage_oldest_per_non_terminal_state  # noqa: E402,F401 - Storage.oldest
from test_priorities import *  # noqa: E402,F403 - and those of job priorities
from test_lease_loss import *  # noqa: E402,F403 - lost leases cancel their handlers (issue 24)
from test_pause import *  # noqa: E402,F403 - a pause that pauses
from test_wakeups import test_the_reaper_promotes_a_delayed_job_on_time_with_no_consumer  # noqa: E402,F401
from test_flows import *  # noqa: E402,F403 - trees of jobs (across queues: ones sharing a hash tag)
from test_event_results import *  # noqa: E402,F403 - results in events, statuses in bulk, error data
from test_clear_retention import *  # noqa: E402,F403 - clear, count-based retention
from test_groups import *  # noqa: E402,F403 - groups (fair queuing): a queue's group keys share its slot
from test_steps import *  # noqa: E402,F403 - steps of durable jobs (issue 34)
from test_sleep import *  # noqa: E402,F403 - durable sleep (issue 34)
from test_signals import *  # noqa: E402,F403 - signals (Job.wait_for_signal)
from test_durable_crossings import *  # noqa: E402,F403 - sleep and signals across trees, groups, retention...
from test_dependencies import *  # noqa: E402,F403 - dependencies (depends_on; across queues: ones sharing a hash tag)

from trioqueue.storage import NewJob, Storage  # noqa: E402
from trioqueue.storage.redis import RedisStorage  # noqa: E402


@pytest.fixture
def backend() -> str:
    return "redis-cluster"


@pytest.fixture
async def storage(redis_cluster_url: str) -> AsyncIterator[Storage]:
    st = RedisStorage(redis_cluster_url, prefix=f"c-{uuid.uuid4().hex[:12]}", cluster=True)
    async with st:
        yield st


async def test_cluster_queues_live_in_different_slots(redis_cluster_url: str) -> None:
    """Several queues spread over the masters; each queue's scripts run on its own slot."""
    st = RedisStorage(redis_cluster_url, prefix=f"c-{uuid.uuid4().hex[:12]}", cluster=True)
    async with st:
        names = [f"q{i}" for i in range(12)]
        for name in names:
            await st.enqueue(name, [NewJob("j", b"e", 3, 60.0)])
        for name in names:
            claims = await st.dequeue(name, "w", 10, 1, 30)
            assert [c.id for c in claims] == ["j"]


async def test_cluster_scripts_run_as_functions_and_load_again_after_a_flush(redis_cluster_url: str) -> None:
    """Through GLIDE on a cluster too, a script goes as FCALL of its library, loaded on
    every primary on first use and again after ``FUNCTION FLUSH``."""
    from trioqueue.storage.redis import _lua

    st = RedisStorage(redis_cluster_url, prefix=f"c-{uuid.uuid4().hex[:12]}", cluster=True)
    async with st:
        await st.enqueue("fq", [NewJob("a", b"e", 3, 60.0)])
        listed = await st._transport.command(["FUNCTION", "LIST", "LIBRARYNAME", "trioqueue_enqueue_plain_*"])
        assert _lua.library("enqueue_plain")[0] in repr(listed)
        await st._transport.command(["FUNCTION", "FLUSH"])
        await st.enqueue("fq", [NewJob("b", b"e", 3, 60.0)])
        assert [c.id for c in await st.dequeue("fq", "w", 10, 0, 30)] == ["a", "b"]
        listed = await st._transport.command(["FUNCTION", "LIST", "LIBRARYNAME", "trioqueue_claim_*"])
        assert _lua.library("claim")[0] in repr(listed)


async def test_cluster_queues_sharing_a_braced_tag_share_a_slot_and_others_keep_their_keys(redis_cluster_url: str) -> None:
    """A queue named with a ``{tag}`` has its keys under the hash tag ``{prefix:tag}`` (so
    queues with the same tag share a slot); a queue without braces keeps ``{prefix:queue}``."""
    from trioqueue.storage.redis import _lua

    prefix = f"c-{uuid.uuid4().hex[:12]}"
    st = RedisStorage(redis_cluster_url, prefix=prefix, cluster=True)
    async with st:
        assert st._base("plain") == "{" + prefix + ":plain}"
        assert st._base("a{grp}") == "{" + prefix + ":grp}:a{grp}"
        for name in ("plain", "a{grp}", "b{grp}"):
            await st.enqueue(name, [NewJob("j", b"e", 3, 60.0)])
            slot = await st._transport.command(["CLUSTER", "KEYSLOT", st._base(name) + ":jobs"])
            assert int(slot) == _lua.hash_slot(st._base(name)), name
        assert _lua.hash_slot(st._base("a{grp}")) == _lua.hash_slot(st._base("b{grp}"))
        assert await st.get_job("a{grp}", "j") is not None and await st.get_job("b{grp}", "j") is not None
        assert await st._transport.command(["EXISTS", "{" + prefix + ":plain}:jobs"]) == 1


async def test_cluster_a_tree_across_queues_in_different_slots_is_refused_writing_nothing(redis_cluster_url: str) -> None:
    from trioqueue import Child, FlowError, Queue
    from trioqueue.storage.redis import _lua

    prefix = f"c-{uuid.uuid4().hex[:12]}"
    st = RedisStorage(redis_cluster_url, prefix=prefix, cluster=True)
    a, b = "reports", "fetchers"
    assert _lua.hash_slot(st._base(a)) != _lua.hash_slot(st._base(b))
    async with st, Queue(st, name=a) as q:
        tree = [Child("fetch-a", 1, queue=b), Child("fetch-b", 2, queue=b, children=[Child("auth", 3)])]
        with pytest.raises(FlowError, match=r"the tree of job 'report' spans queues 'reports', 'fetchers', .*different Redis Cluster slots.*nothing was written"):
            await q.enqueue("report", None, children=tree)
        for queue, job_id in ((a, "report"), (b, "fetch-a"), (b, "fetch-b"), (b, "auth")):
            assert await st.get_job(queue, job_id) is None, (queue, job_id)
        # the same tree on queues sharing a tag goes through
        ta, tb = "reports{grp}", "fetchers{grp}"
        async with Queue(st, name=ta) as tq:
            tagged_tree = [Child("fetch-a", 1, queue=tb), Child("fetch-b", 2, queue=tb, children=[Child("auth", 3)])]
            assert (await tq.enqueue("report", None, children=tagged_tree)).status.value == "queued"
        assert (await st.get_job(tb, "fetch-a")) is not None
        parent = await st.get_job(tb, "auth")
        assert parent is not None and parent.parent == (tb, "fetch-b")


async def test_cluster_children_added_on_a_queue_in_another_slot_are_refused(redis_cluster_url: str) -> None:
    import trio

    from trioqueue import Child, FlowError, Job, Queue
    from trioqueue.storage.redis import _lua

    st = RedisStorage(redis_cluster_url, prefix=f"c-{uuid.uuid4().hex[:12]}", cluster=True)
    home = "home"
    other = next(n for n in ("elsewhere", "elsewhere-2") if _lua.hash_slot(st._base(n)) != _lua.hash_slot(st._base(home)))
    seen: dict[str, str] = {}

    async def parent(job: Job[None]) -> str:
        try:
            await job.add_children([Child("kid", None, queue=other)])
        except FlowError as e:
            seen["error"] = str(e)
        return "alone"

    async with st:
        async with Queue(st, name=home, handler=parent, block_timeout=0.5) as q:
            with trio.fail_after(10):
                assert await q.enqueue_and_wait("p", None) == "alone"
        assert f"the tree of job 'p' spans queues 'home', '{other}'" in seen["error"]
        assert "nothing was written" in seen["error"]
        assert await st.get_job(other, "kid") is None
