"""RedisStorage on a Redis Sentinel service, against real servers the test starts (one
primary, one replica, three sentinels: ``redis_sentinel.SentinelSet``): the primary is
found through the sentinels (also when the first one is down), a malformed Sentinel URL is
named as such, and a primary SIGKILLed under load is followed to the promoted replica.
With acknowledged writes (``replica_ack_timeout``) no acknowledged job is lost; without,
the jobs lost are counted and printed (asynchronous replication may lose some)."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio

from redis_sentinel import SentinelSet
from redis_server import free_port
from trioqueue import Job, JobState, Queue, StorageError, ValidationError
from trioqueue.storage import NewJob, StorageEvent, from_url
from trioqueue.storage.redis import RedisStorage


@pytest.fixture(scope="module")
def deployment() -> Iterator[SentinelSet]:
    """One deployment for the tests that do not kill a node, with a password on the data
    nodes and another on the sentinels (percent-encoded in the URL)."""
    with SentinelSet(password="data:pw", sentinel_password="sentinel pw") as dep:
        yield dep


def _prefix() -> str:
    return f"st-{uuid.uuid4().hex[:10]}"


def _connected_port(storage: RedisStorage) -> int:
    """The port of the server the storage's command connection is open to."""
    transport: Any = storage._transport
    if hasattr(transport, "_address"):  # valkey-glide: the primary its clients are made for
        return int(transport._address[1])
    conn = transport._client._conn
    assert conn is not None and conn.address is not None
    return int(conn.address[1])


LEAN = pytest.mark.parametrize("lean", [True, False], ids=["lean", "glide"])


async def _round_trip(storage: RedisStorage) -> None:
    """A whole job through a Queue: commands, a blocking claim, pub/sub."""

    async def handler(job: Job[Any]) -> str:
        return f"hello {job.payload}"

    async with Queue(storage, handler=handler, block_timeout=0.5) as q:
        with trio.fail_after(20):
            assert await q.enqueue_and_wait("greet", "sentinel") == "hello sentinel"


@LEAN
async def test_from_url_finds_the_primary_through_the_sentinels(deployment: SentinelSet, lean: bool) -> None:
    storage = from_url(deployment.url, prefix=_prefix(), lean=lean)
    assert isinstance(storage, RedisStorage)
    await _round_trip(storage)
    async with storage:
        await storage.enqueue("q", [])
        assert _connected_port(storage) == deployment.primary_port()
    assert "redis+sentinel://" in repr(storage) and "mymaster" in repr(storage)


@LEAN
async def test_a_sentinel_list_whose_first_sentinel_is_down_still_finds_the_primary(
    deployment: SentinelSet, lean: bool
) -> None:
    dead = ("127.0.0.1", free_port())  # nobody listens there
    storage = RedisStorage.from_sentinels(
        [dead, *deployment.addresses],
        service="mymaster",
        db=0,
        password=deployment.password,
        sentinel_password=deployment.sentinel_password,
        prefix=_prefix(),
        lean=lean,
    )
    await _round_trip(storage)
    async with storage:
        await storage.enqueue("q", [])
        assert _connected_port(storage) == deployment.primary_port()


async def test_the_cli_takes_a_sentinel_url(deployment: SentinelSet) -> None:
    """``--storage redis+sentinel://...``: every command opens its storage with
    ``from_url`` (enqueue and stats stand for them)."""
    name = f"cli-{uuid.uuid4().hex[:8]}"

    async def cli(*args: str) -> str:
        cmd = [sys.executable, "-m", "trioqueue", *args, "--storage", deployment.url, "--name", name]
        with trio.fail_after(30):
            proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False)
        assert proc.returncode == 0, proc.stderr.decode()
        return proc.stdout.decode()

    await cli("enqueue", "job-1", "--payload", "1")
    assert json.loads(await cli("stats", "--json"))[name]["counts"]["queued"] == 1


async def test_no_sentinel_that_answers_is_reported_at_once() -> None:
    url = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/mymaster/0"
    with trio.fail_after(10), pytest.raises(StorageError) as info:
        async with RedisStorage(url, prefix=_prefix()):
            pass
    assert "no sentinel named the primary of 'mymaster'" in str(info.value)


async def test_an_unknown_service_is_named(deployment: SentinelSet) -> None:
    storage = RedisStorage.from_sentinels(
        deployment.addresses[:1], service="nosuch", sentinel_password=deployment.sentinel_password, prefix=_prefix()
    )
    with trio.fail_after(10), pytest.raises(StorageError, match="does not monitor 'nosuch'"):
        async with storage:
            pass


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h1:26379,h2:26379", "without a service name"),
        ("redis+sentinel://h1:26379,,h2/mymaster", "empty sentinel address"),
        ("redis+sentinel://h1:port/mymaster", "bad sentinel port 'port'"),
        ("redis+sentinel://h1/mymaster/zero", "database must be a number"),
        ("redis+sentinel://h1/mymaster/0/extra", "unexpected path"),
        ("redis+sentinel://h1/mymaster?replica_ack_timeout=soon", "replica_ack_timeout must be a number"),
        ("redis+sentinel://h1/mymaster?replica_ack_timeout=30", "less than request_timeout"),
    ],
)
def test_a_malformed_sentinel_url_names_the_problem(url: str, says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        from_url(url)


async def test_a_write_no_replica_acknowledges_raises(redis_url: str) -> None:
    """Acknowledged writes on any Redis URL: the suite's standalone server has no replica,
    so an enqueue waits ``replica_ack_timeout`` and raises; the job is on the primary
    all the same (a failover could lose it). Reads and claims wait for nobody."""
    storage = from_url(redis_url + "?replica_ack_timeout=0.2", prefix=_prefix())
    async with storage:
        with trio.fail_after(5), pytest.raises(StorageError, match="no replica acknowledged the write within 0.2 s"):
            await storage.enqueue("q", [NewJob("x", b"1", 1, 60.0)])
        record = await storage.get_job("q", "x")
        assert record is not None and record.state.startswith("queued")
        assert [c.id for c in await storage.dequeue("q", "w", 1, 0.0, 30.0)] == ["x"]


def test_the_scripts_that_wait_for_no_replica_exist() -> None:
    """Acknowledged writes wait after every script but the ones listed (reads, claims,
    heartbeats...): a name there that no script has (renamed, removed) would make that
    script wait after all. A new read-only script belongs in the list."""
    from trioqueue.storage.redis import _lua
    from trioqueue.storage.redis._lua import UNACKED_SCRIPTS

    assert UNACKED_SCRIPTS <= set(_lua.SCRIPT_NAMES), UNACKED_SCRIPTS - set(_lua.SCRIPT_NAMES)
    storage = RedisStorage("redis://127.0.0.1:1", replica_ack_timeout=1.0)
    unacked = {name for name in _lua.SCRIPT_NAMES if not storage._runner.scripts[name].acked}
    assert unacked == UNACKED_SCRIPTS


def test_sentinel_options_that_do_not_go_together_are_refused() -> None:
    with pytest.raises(ValidationError, match="no cluster"):
        RedisStorage("redis+sentinel://h1/mymaster", cluster=True)
    with pytest.raises(ValidationError, match="client="):
        RedisStorage("redis+sentinel://h1/mymaster", client=object())
    with pytest.raises(ValidationError, match="not supported on Redis Cluster"):
        RedisStorage("redis://h1:7000", cluster=True, replica_ack_timeout=1.0)
    with pytest.raises(ValidationError, match="a sentinel address is"):
        RedisStorage.from_sentinels([("h1", "port")], service="mymaster")
    with pytest.raises(ValidationError, match="bad sentinel port"):
        RedisStorage.from_sentinels(["h1:port"], service="mymaster")
    with pytest.raises(ValidationError, match="master name"):
        RedisStorage.from_sentinels(["h1"], service="")
    with pytest.raises(ValidationError, match="list of addresses"):
        RedisStorage.from_sentinels("h1:26379", service="mymaster")  # type: ignore[arg-type]


def _known(storage: RedisStorage) -> tuple[str, int] | None:
    """The primary the storage's sentinels last named (None: forgotten, to ask again)."""
    return storage._transport.sentinels.known  # type: ignore[attr-defined]


async def _failover(deployment: SentinelSet) -> int:
    """``SENTINEL FAILOVER mymaster COORDINATED`` (Valkey 9): the primary is demoted
    first (it stays alive, a replica), then the replica promoted; the new primary's port
    once every node says so (polled: the servers' own state). A plain ``SENTINEL
    FAILOVER`` promotes at once and demotes the old primary only ~10 s later (the
    sentinels' INFO period), which takes writes meanwhile (see the plain failover test
    below)."""
    old = await trio.to_thread.run_sync(deployment.primary_port)
    with trio.fail_after(30):
        # a replica demoted by the last failover is a candidate once the sentinel has its
        # INFO again (NOGOODSLAVE until then; INPROG while that failover still ends)
        while (reply := deployment.sentinel(0, "SENTINEL", "FAILOVER", "mymaster", "COORDINATED")) != "OK":
            assert str(reply).startswith(("NOGOODSLAVE", "INPROG")), reply
            await trio.sleep(0.1)
    with trio.fail_after(30):
        while True:
            new = await trio.to_thread.run_sync(deployment.primary_port)
            if new != old and b"role:slave" in deployment.node(old, "INFO", "replication"):
                return new
            await trio.sleep(0.05)


async def _watcher_listening(deployment: SentinelSet) -> None:
    """Until a sentinel has a subscriber (the storage's watcher: nothing else subscribes
    to the sentinels here). Polled: the sentinels announce nothing of the kind."""

    def subscribed() -> bool:
        return any(
            " sub=1 " in f" {line} "
            for i in range(len(deployment.sentinels))
            for line in deployment.sentinel(i, "CLIENT", "LIST").decode().splitlines()
        )

    with trio.fail_after(10):
        while not await trio.to_thread.run_sync(subscribed):
            await trio.sleep(0.02)


def _drain(rx: trio.MemoryReceiveChannel[list[StorageEvent]]) -> list[StorageEvent]:
    """The events already delivered (none is waited for)."""
    events: list[StorageEvent] = []
    while True:
        try:
            events += rx.receive_nowait()
        except trio.WouldBlock:
            return events


async def _resync_then_events(
    storage: RedisStorage, rx: trio.MemoryReceiveChannel[list[StorageEvent]], tag: str
) -> list[str]:
    """Wait for a ``resync`` (the listener's cue: events may have been missed), then
    until the events of new jobs arrive again (those published before the subscription
    moved are not seen: a job a round, each waited for briefly). The jobs enqueued."""
    with trio.fail_after(10):
        while not any(e.kind == "resync" for e in await rx.receive()):
            pass
    ids: list[str] = []
    with trio.fail_after(10):
        while True:
            ids.append(f"{tag}{len(ids)}")
            await storage.enqueue("q", [NewJob(ids[-1], b"1", 1, 60.0)])
            with trio.move_on_after(0.2):
                while not any(e.job_id == ids[-1] for e in await rx.receive()):
                    pass
                return ids


@LEAN
async def test_a_demoted_primary_is_followed_and_listeners_resync(
    deployment: SentinelSet, lean: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A failover that keeps the old primary alive, as a replica: while the storage's
    watchdog runs (as under a running Queue) it hears the sentinels' ``+switch-master``
    and moves; without it, the next command finds the new primary (the
    demoted node answers it ``READONLY``, or has closed the connection).
    Either way the event listeners get a ``resync``, then the new primary's events, and
    no job is lost (a coordinated failover waits for the replica)."""
    storage = RedisStorage(deployment.url, prefix=_prefix(), lean=lean, watch_interval=0.05)
    async with storage, storage.subscribe("q") as rx:
        await storage.enqueue("q", [NewJob("a", b"1", 1, 60.0)])
        with trio.fail_after(10):
            while not any(e.job_id == "a" for e in await rx.receive()):
                pass
        async with trio.open_nursery() as nursery:
            nursery.start_soon(storage.watchdog)
            await _watcher_listening(deployment)  # (else the storage may move by a command first)
            _drain(rx)
            new = await _failover(deployment)
            ids = ["a", *await _resync_then_events(storage, rx, "b")]
            heard = f"to 127.0.0.1:{new}"
            with trio.fail_after(5):  # the watcher logs the announcement (polled: no event for a log)
                while not any("+switch-master" in r.getMessage() and heard in r.getMessage() for r in caplog.records):
                    await trio.sleep(0.02)
            assert _known(storage) == ("127.0.0.1", new)
            nursery.cancel_scope.cancel()
        assert _connected_port(storage) == new
        # no watcher now: the next command follows the failover on its own
        _drain(rx)
        new = await _failover(deployment)
        await storage.enqueue("q", [NewJob("c", b"1", 1, 60.0)])
        assert _connected_port(storage) == new
        ids += ["c", *await _resync_then_events(storage, rx, "d")]
        claimed = await storage.dequeue("q", "w", 100, 1.0, 30.0)
        assert sorted(c.id for c in claimed) == sorted(ids)


class _AfterFirstStep(trio.abc.Instrument):
    """Calls ``action`` once, when ``task`` has run its first step (up to its first
    checkpoint) and before it runs again."""

    def __init__(self, task_name: str, action: Callable[[], None]) -> None:
        self.task_name = task_name
        self.action: Callable[[], None] | None = action

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name == self.task_name and self.action is not None:
            action, self.action = self.action, None
            action()


async def test_a_primary_forgotten_while_asked_for_is_never_answered_as_none(deployment: SentinelSet) -> None:
    """``Sentinels.primary()`` with a primary known checkpoints before it answers: a
    ``forget()`` (a failed connection elsewhere) that lands then must not make it answer
    ``None`` (its caller then failed with a TypeError): it asks the sentinels again.
    (The instrument makes the forget land exactly there, on every run.)"""
    from trioqueue._drivers.resp._sentinel import Sentinels
    from trioqueue._drivers.resp._transport import ConnParams

    sentinels = Sentinels(
        ConnParams(
            sentinels=tuple(deployment.addresses),
            service="mymaster",
            sentinel_password=deployment.sentinel_password,
        )
    )
    with trio.fail_after(10):
        first = await sentinels.primary()
        answers: list[Any] = []

        async def ask() -> None:
            answers.append(await sentinels.primary())

        instrument = _AfterFirstStep("asker", lambda: sentinels.forget(first))
        trio.lowlevel.add_instrument(instrument)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask, name="asker")
        finally:
            trio.lowlevel.remove_instrument(instrument)
    assert instrument.action is None  # the forget landed
    assert answers == [("127.0.0.1", deployment.primary_port())]


def _sentinel_calls(deployment: SentinelSet) -> int:
    """How many connections the sentinels have accepted (their INFO has no command
    stats; the storage opens one each time it asks, the sentinels keep theirs open)."""
    total = 0
    for i in range(len(deployment.sentinels)):
        for line in deployment.sentinel(i, "INFO", "stats").decode().splitlines():
            if line.startswith("total_connections_received:"):
                total += int(line.split(":")[1])
    return total - len(deployment.sentinels)  # the INFO connections themselves


async def test_a_readonly_reply_makes_the_storage_ask_the_sentinels_again(deployment: SentinelSet) -> None:
    """A primary that answers ``READONLY`` was demoted: the lean client forgets it, closes
    its connections to it (the listener gets a ``resync``) and asks the sentinels again
    at each retry. (Here the primary is not demoted: a script makes it answer so, and the
    sentinels keep naming it, so the call gives up after ``retry_timeout``.)"""
    storage = RedisStorage(deployment.url, prefix=_prefix(), retry_timeout=0.5, watch_interval=0.05)
    readonly = "return redis.error_reply('READONLY You can\\'t write against a read only replica.')"
    async with storage, storage.subscribe("q") as rx:
        transport: Any = storage._transport
        first = await transport.command(["CLIENT", "ID"])
        asked = await trio.to_thread.run_sync(_sentinel_calls, deployment)
        _drain(rx)
        with pytest.raises(StorageError, match="READONLY"):
            await transport.command(["EVAL", readonly, "0"])
        assert await trio.to_thread.run_sync(_sentinel_calls, deployment) >= asked + 2  # once a retry
        assert await transport.command(["CLIENT", "ID"]) != first  # a new connection
        await _resync_then_events(storage, rx, "r")


@pytest.mark.parametrize("ack", [1.0, None], ids=["acked-writes", "async-replication"])
@LEAN
async def test_a_killed_primary_is_followed_to_the_promoted_replica_under_load(ack: float | None, lean: bool) -> None:
    """SIGKILL the primary while a producer enqueues and a worker Queue consumes: claims
    resume on the promoted replica within 10 s. With acknowledged writes every enqueue
    that was acknowledged ends completed (the old primary comes back as a replica of the
    new one, as an operator would bring it back: until then no write can be
    acknowledged, so the producer and the settlements wait); without, the acknowledged
    jobs the promoted replica never received are counted and printed."""
    dep = SentinelSet()
    await trio.to_thread.run_sync(dep.start)
    try:
        await _failover_under_load(dep, ack, lean)
    finally:
        await trio.to_thread.run_sync(dep.close)


class _Progress:
    """Tasks wait until a condition on the test's own tallies holds; whoever changes one
    calls :meth:`changed` (no polling of what this process does itself)."""

    def __init__(self) -> None:
        self._lot = trio.lowlevel.ParkingLot()

    def changed(self) -> None:
        self._lot.unpark_all()

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._lot.park()


class _Producer:
    """Enqueues five jobs at a time, a steady trickle, until stopped; keeps the ids whose
    enqueue was acknowledged (with when it was sent) and counts those refused."""

    def __init__(self, progress: _Progress) -> None:
        self.acked: dict[str, float] = {}  # job id -> when its acknowledged enqueue was sent
        self.refused = 0  # enqueues that raised StorageError (not acknowledged: not counted)
        self.stop = trio.Event()
        self.progress = progress

    async def run(self, q: Queue[Any, Any]) -> None:
        n = 0
        while not self.stop.is_set():
            ids = [f"j{n + k}" for k in range(5)]
            n += 5
            sent = trio.current_time()
            try:
                results = await q.enqueue_many([(i, i) for i in ids])
            except StorageError:
                self.refused += 5
                self.progress.changed()
                continue
            self.acked.update((r.id, sent) for r in results if r.status == "queued")
            self.progress.changed()
            await trio.sleep(0.01)  # a trickle, not a flood


async def _failover_under_load(dep: SentinelSet, ack: float | None, lean: bool) -> None:
    prefix = _prefix()
    options: dict[str, Any] = dict(prefix=prefix, replica_ack_timeout=ack, request_timeout=3.0, lean=lean)
    producer_storage = RedisStorage(dep.url, **options)
    worker_storage = RedisStorage(dep.url, **options)
    progress = _Progress()
    load = _Producer(progress)
    acked = load.acked
    ran: dict[str, float] = {}  # job id -> when its handler first ran
    killed_at: float | None = None
    resumed = trio.Event()  # a job enqueued after the kill ran: claims resumed

    async def handler(job: Job[Any]) -> None:
        now = trio.current_time()
        ran.setdefault(job.id, now)
        progress.changed()
        if killed_at is not None and acked.get(job.id, 0.0) > killed_at:
            resumed.set()  # a job sent after the kill: claimed from the new primary

    producer = Queue(producer_storage, name="load")
    worker = Queue(worker_storage, name="load", handler=handler, concurrency=4, block_timeout=0.5,
                   visibility_timeout=5.0)  # fmt: skip
    async with producer, worker, trio.open_nursery() as nursery:
        nursery.start_soon(load.run, producer)
        with trio.fail_after(10):  # load before the kill
            await progress.until(lambda: len(ran) >= 100)
        old_port = dep.primary.port
        dep.primary.kill()
        killed_at = trio.current_time()
        if ack is not None:
            # The promoted replica has no replica of its own: bring the old primary back
            # as its replica once the sentinels promoted it (polled: another process's state).
            with trio.fail_after(30):
                while (new_port := await trio.to_thread.run_sync(dep.primary_port)) == old_port:
                    await trio.sleep(0.05)
            dep.primary.extra += ["--replicaof", "127.0.0.1", str(new_port)]
            await trio.to_thread.run_sync(dep.primary.start)
        with trio.fail_after(10):
            await resumed.wait()
        resumed_after = trio.current_time() - killed_at
        after = len(acked)
        with trio.fail_after(20):  # load after the failover
            await progress.until(lambda: len(acked) >= after + 100)
        load.stop.set()
        # wherever the sentinels say the primary is now (on a loaded machine they have
        # failed over a second time, back to the old primary once it was a replica)
        new_port = await trio.to_thread.run_sync(dep.primary_port)
        assert _connected_port(worker_storage) == new_port

        async def state(job_id: str) -> JobState | None:
            status = await worker.get_status(job_id)
            return None if status is None else status.state

        # every acknowledged job the new primary holds is completed in the end
        with trio.fail_after(20):
            pending = list(acked)
            while pending:
                states = {j: await state(j) for j in pending}
                lost = [j for j, s in states.items() if s is None]
                pending = [j for j, s in states.items() if s is not None and s != JobState.COMPLETED]
                if pending:
                    await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    print(
        f"\nSentinel failover ({'lean' if lean else 'glide'}, {'acknowledged writes' if ack else 'asynchronous replication'}):"
        f" claims resumed {resumed_after:.2f} s after the kill; {len(acked)} enqueues acknowledged,"
        f" {len(lost)} of them lost, {load.refused} refused (not acknowledged)"
    )
    if ack is not None:
        assert lost == [], f"{len(lost)} acknowledged jobs lost with acknowledged writes: {lost[:10]}"


@pytest.mark.parametrize("ack", [1.0, None], ids=["acked-writes", "async-replication"])
async def test_a_plain_failover_loses_the_writes_the_old_primary_took_unless_acknowledged(ack: float | None) -> None:
    """A plain ``SENTINEL FAILOVER`` promotes the replica at once and demotes the old
    primary only ~10 s later: until the sentinels announce the switch (about 1 s), the
    producer's writes go to the old primary, which still takes them, and they are lost
    with its demotion. With acknowledged writes, the promoted replica no longer
    acknowledges them: they are refused, none is lost. (Counted on the new primary.)"""
    dep = SentinelSet()
    await trio.to_thread.run_sync(dep.start)
    try:
        progress = _Progress()
        load = _Producer(progress)
        storage = RedisStorage(dep.url, prefix=_prefix(), replica_ack_timeout=ack)
        async with Queue(storage, name="load") as producer, trio.open_nursery() as nursery:
            nursery.start_soon(load.run, producer)
            with trio.fail_after(10):
                await progress.until(lambda: len(load.acked) >= 100)
            old = await trio.to_thread.run_sync(dep.primary_port)
            assert dep.sentinel(0, "SENTINEL", "FAILOVER", "mymaster") == "OK"
            with trio.fail_after(10):  # polled: the sentinels' own state
                while (new := await trio.to_thread.run_sync(dep.primary_port)) == old:
                    await trio.sleep(0.05)
            with trio.fail_after(10):  # the producer writes to the new primary
                while _known(storage) != ("127.0.0.1", new):  # polled: the storage has no event for it
                    await trio.sleep(0.05)
                # acknowledged there; or, with acknowledged writes, refused: the new
                # primary has no replica until the old one is demoted, ~10 s later
                after, refused = len(load.acked), load.refused
                await progress.until(lambda: len(load.acked) >= after + 50 or load.refused > refused)
            load.stop.set()
            nursery.cancel_scope.cancel()
        checker = RedisStorage(dep.url, prefix=storage.prefix)  # asks the sentinels: the new primary
        async with checker:
            assert _connected_port(checker) == new
            lost = [j for j in load.acked if await checker.get_job("load", j) is None]
        print(
            f"\nplain SENTINEL FAILOVER ({'acknowledged writes' if ack else 'asynchronous replication'}):"
            f" {len(load.acked)} enqueues acknowledged, {len(lost)} of them lost, {load.refused} refused"
        )
        if ack is not None:
            assert lost == [], f"{len(lost)} acknowledged jobs lost with acknowledged writes: {lost[:10]}"
    finally:
        await trio.to_thread.run_sync(dep.close)
