"""RedisStorage-specific tests: the Lua scripts, against real servers. No fakes.

Scripts run as Redis functions (their libraries loaded on first use and again after a
flush, helpers and constants made once a load), every key a script touches is declared
and sent (and no other), each script carries only the prelude definitions it uses, and
the key layout and notice kinds come from the Python declarations.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from redis_helpers import _calls, _done, _job, _prefix

from trioqueue.storage.redis import RedisStorage


@pytest.fixture
async def st(redis_url: str) -> AsyncIterator[RedisStorage]:
    s = RedisStorage(redis_url, prefix=_prefix())
    async with s:
        yield s


_FLUSHES = pytest.mark.parametrize("flush", [["SCRIPT", "FLUSH"], ["FUNCTION", "FLUSH"]], ids=["script", "function"])


async def test_scripts_run_as_redis_functions_loaded_on_first_use(st: RedisStorage) -> None:
    """On the lean client a script goes as FCALL of its library form (its helpers made once,
    at load, not on every call): the first call finds no function and loads it."""
    from trioqueue.storage.redis import _lua

    evalsha = await _calls(st, "evalsha")
    await st.enqueue("q", [_job("a")])
    await st.enqueue("q", [_job("b")])
    claim = (await st.dequeue("q", "w", 1, 0, 30))[0]
    await st.settle("q", "w", [_done(claim, b"r")])
    assert await _calls(st, "evalsha") == evalsha
    assert await _calls(st, "fcall") >= 4
    loaded = {lib[1] for lib in await st._transport.command(["FUNCTION", "LIST"])}
    for name in ("enqueue_plain", "claim", "settle"):
        assert _lua.library(name)[0].encode() in loaded, name
    assert (await st.get_job("q", "a")).result == b"r"


_PER_CALL = """local A = KEYS[1]
local N = 5
local M = 6
local T = {x = 1, y = 'a'}
local U = {x = 1}
local W = {}
local S = {}
local function add(x) S[#S + 1] = x return #S end
M = M + 1
U.x = U.x + 1
table.insert(W, 1)
return {add(A) + N + T.x, M, U.x, #W, T.y}
"""


async def test_a_library_makes_helpers_and_constants_once_and_values_each_call(st: RedisStorage) -> None:
    """The library form of a script: functions, literals never assigned and literal tables
    only read are made at load; everything else (KEYS, a literal assigned later, a table
    written or passed on) is assigned again at each call, so no call sees another's."""
    from trioqueue.storage.redis import _lua

    fname, lib = _lua._as_library("t", _PER_CALL)
    once = lib.split("redis.register_function")[0]
    assert [line.split()[1] for line in once.splitlines() if line.startswith("local ") and "=" in line] == [
        "N", "T", "function"
    ]
    assert "local A, M, U, W, S\n" in once
    await st._transport.command(["FUNCTION", "LOAD", "REPLACE", lib])
    for _ in range(3):
        assert await st._transport.command(["FCALL", fname, "1", "k"]) == [7, 7, 2, 1, b"a"]


@_FLUSHES
async def test_scripts_load_again_after_a_flush(st: RedisStorage, flush: list[str]) -> None:
    await st.enqueue("q", [_job("a")])
    await st._transport.command(flush)
    assert (await st.enqueue("q", [_job("b")]))[0].status == "queued"
    await st._transport.command(flush)
    assert [c.id for c in await st.dequeue("q", "w", 10, 0, 30)] == ["a", "b"]


@_FLUSHES
async def test_blocking_claim_after_a_flush(st: RedisStorage, flush: list[str]) -> None:
    """The claim script rides behind BLMOVE (FCALL, or EVALSHA); after a flush it fails
    (Function not found, NOSCRIPT) and the job moved by the BLMOVE is claimed the
    ordinary way."""
    claimed: list[str] = []
    assert await st.dequeue("q", "w", 10, 0.05, 30) == []  # drained: the next call blocks at once

    async def consumer(task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        claimed.extend(c.id for c in await st.dequeue("q", "w", 10, 10.0, 30))

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            await nursery.start(consumer)
            await trio.testing.wait_all_tasks_blocked()
            await st._transport.command(flush)
            await st.enqueue("q", [_job("after-flush")])
    assert claimed == ["after-flush"]
    rec = await st.get_job("q", "after-flush")
    assert rec is not None and rec.state.startswith("processing:") and rec.attempts == 1


def test_every_key_a_script_touches_is_declared_in_keys() -> None:
    """Scripts used to derive keys from KEYS[1] by concatenation (invisible to Redis
    Cluster routing and ACL key patterns)."""
    import re

    from trioqueue.storage.redis import _lua

    declared = {
        "JOBS", "META", "ENV", "LISTENING", "ERRORS", "PROGRESS", "Q", "D", "L", "SWEEP_AT", "WK", "PROCS",
        "SEQ", "PAUSED", "CTL", "SCHED", "SCHED_LAST", "EVENTS", "NOTICES", "STATES", "TREE", "TNOTES", "TQS", "P", "KEYS[1]", "KEYS[QK + 1]",
        "FLOW", "RATE_LOG",  # flow control: the last KEYS of the scripts that use them
        "LANE", "LANES[p]",  # the ready lists of the priorities: KEYS[20..28] and Q
        "unpack(LANES",  # EXISTS over all of them, or a range of them
        "GREADY", "RING", "GRUN", "GPAUSED", "GRATE", "GSLEEP", "flow",  # groups (include groups; flow: FLOW passed in)
    }  # fmt: skip
    keyless = {"TIME", "PUBLISH"}
    for name in _lua.SCRIPT_NAMES:
        code = _lua.source(name)
        assert "KEYS[1] .." not in code and ":job:" not in code, name
        for cmd, first in re.findall(r"redis\.call\('(\w+)',\s*([^,)]+)", code):
            if cmd in keyless and cmd != "PUBLISH":
                continue
            assert first.strip() in declared, (name, cmd, first)
    prelude = _lua._read_fragment("prelude")
    for i, suffix in enumerate(_lua.QUEUE_KEY_NAMES, start=1):
        assert f"KEYS[{i}]" in prelude, suffix


def test_each_queue_script_is_sent_the_keys_it_names_and_no_others() -> None:
    """A script's KEYS are renumbered to the keys it uses (each costs the server about
    1,100 instructions a call): every key name it binds must still point at the same
    queue key, and it must be sent exactly the keys it binds, in that order."""
    import re

    from trioqueue.storage.redis import _lua

    layout = {name: int(n) for name, n in re.findall(r"^local (\w+) = KEYS\[(\d+)\]$", _lua._read_fragment("prelude"), re.M)}
    lanes = [int(n) for n in re.findall(r"KEYS\[(\d+)\]", re.search(r"local LANES = \{(.*)\}", _lua._read_fragment("prelude")).group(1))]
    assert len(layout) + len(lanes) == len(_lua.QUEUE_KEY_NAMES)
    for name in _lua.SCRIPT_NAMES:
        code, sent = _lua.source(name), _lua.script_keys(name)
        if "--@include prelude" not in _lua._read(name):
            assert sent == () and code == _lua._read(name)
            continue
        bound = {var: int(n) for var, n in re.findall(r"^local (\w+) = KEYS\[(\d+)\]$", code, re.M)}
        for var, k in bound.items():  # the same queue key as in the full layout
            assert sent[k - 1] == layout[var] - 1, (name, var)
        words = set(re.findall(r"\w+", re.sub(r"--.*", "", code.replace("".join(f"local {v} = KEYS[{k}]\n" for v, k in bound.items()), ""))))
        expected = {layout[v] - 1 for v in layout if v in words}
        if re.search(r"^local LANES = \{KEYS", code, re.M):  # not enqueue_plain's (no other lanes)
            expected |= {n - 1 for n in lanes}
        assert set(sent) == expected, name
        refs = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", code)}
        assert refs == set(range(1, len(sent) + 1)), name
        assert ("QK" in words) == (f"local QK = {len(sent)}\n" in code), name


def test_each_script_carries_the_prelude_definitions_it_uses_and_no_others() -> None:
    """A script call runs the script's whole text, so every ``local function`` of the
    prelude would make a closure on every call: a script carries only the definitions it
    uses. None it uses may be missing (a Lua name not defined is a nil global)."""
    import re

    from trioqueue.storage.redis import _lua

    prelude = _lua._definitions(_lua._read_fragment("prelude"))
    assert prelude is not None and len(prelude) > 30
    words = re.compile(r"[A-Za-z_]\w*")
    keys = re.compile(r"KEYS\[\d+\]")  # renumbered per script (see the test above)
    for name in _lua.SCRIPT_NAMES:
        code = keys.sub("KEYS[]", _lua.source(name))
        used = set(words.findall(re.sub(r"(?m)^\s*--.*$", "", code)))
        for d in prelude:
            if name in _lua.VARIANTS and d.names & set(_lua.VARIANTS[name][1]):
                continue  # replaced in this variant
            kept = keys.sub("KEYS[]", d.text) in code
            assert kept == bool(d.names & used), (name, sorted(d.names), kept)
    assert "local function sweep(" in _lua.source("enqueue")
    assert "local function sweep(" not in _lua.source("get_envelope")
    assert _lua.source("lock_acquire") == _lua._read("lock_acquire")  # no include: as written


def test_the_scripts_publish_exactly_the_notice_kinds_on_the_notices_channel() -> None:
    """The prelude's NOTICE table and ``NOTICE_KINDS`` (what subscribe() routes to the
    notices channel) must name the same kinds, or a waiter would miss an outcome."""
    import re

    from trioqueue.storage.redis import _lua
    from trioqueue.storage._base import NOTICE_KINDS

    table = re.search(r"local NOTICE = \{(.*?)\}", _lua.source("settle"), re.DOTALL)
    assert table is not None
    assert set(re.findall(r"(\w+) = true", table.group(1))) == NOTICE_KINDS


def test_the_lua_key_layout_and_notice_kinds_come_from_the_python_declarations() -> None:
    """One source of truth: the prelude as written names no key position and no notice
    kind; both are generated from ``_lua.QUEUE_KEYS`` and ``NOTICE_KINDS``, so a key
    added or moved there (or a notice kind) is what every script sees."""
    import re

    from trioqueue.storage.redis import _lua
    from trioqueue.storage._base import NOTICE_KINDS

    written = (_lua.resources.files(_lua.__package__) / "scripts" / "include" / "prelude.lua").read_text()
    assert not re.search(r"^[^-\n]*KEYS\[\d", written, re.M), "a key position written by hand in the prelude"
    assert "local NOTICE =" not in written and "local SMALL =" not in written
    generated = _lua._read_fragment("prelude")
    variables = dict(re.findall(r"^local (\w+) = KEYS\[(\d+)\]$", generated, re.M))
    for i, (var, suffix) in enumerate(_lua.QUEUE_KEYS, start=1):
        if var is not None:
            assert variables[var] == str(i), (var, suffix)
    lanes = re.search(r"^local LANES = \{(.*)\}$", generated, re.M)
    assert lanes is not None
    lane_positions = [str(i) for i, (var, _) in enumerate(_lua.QUEUE_KEYS, start=1) if var is None]
    assert re.findall(r"KEYS\[(\d+)\]", lanes.group(1)) == lane_positions
    assert "Q" in lanes.group(1).split(", ")
    kinds = re.search(r"^local NOTICE = \{(.*)\}$", generated, re.M)
    assert kinds is not None and set(re.findall(r"(\w+) = true", kinds.group(1))) == NOTICE_KINDS
    assert f"local SMALL = {_lua.SMALL}\n" in generated


def test_a_script_on_several_queues_points_every_key_it_binds_at_the_queue_in_use() -> None:
    """Scripts acting on a tree of jobs across queues (fragment ``queues``) get the same
    keys of each queue in turn: ``use_queue`` must re-point every key variable the script
    binds, and its lanes, at the same positions of that queue's keys (generated once the
    KEYS are numbered), and flush what the previous queue had pending first."""
    import re

    from trioqueue.storage.redis import _lua

    for name in ("tree_act", "flow_enqueue", "flow_add"):
        code = _lua.source(name)
        bound = dict(re.findall(r"^local (\w+) = KEYS\[(\d+)\]$", code, re.M))
        body = code[code.index("local function use_queue(") :]
        body = body[: body.index("\nend\n")]
        assert dict(re.findall(r"^  (\w+) = K\[o \+ (\d+)\]$", body, re.M)) == bound, name
        lanes = re.search(r"^local LANES = \{(.*)\}$", code, re.M)
        assert lanes is not None
        rebound = re.sub(r"KEYS\[(\d+)\]", r"K[o + \1]", lanes.group(1))
        assert "  LANES = {" + rebound + "}\n" in body + "\n", name
        assert body.index("flush()") < body.index("JOBS = K["), name
        if "local function due_flush(" in code:
            assert body.index("due_flush()") < body.index("  flush()"), name
    assert "use_queue" not in _lua.source("settle")  # one queue's scripts pay nothing for it


async def test_tree_act_learns_every_queue_the_trees_span_transitively(redis_url: str) -> None:
    """tree_act acts on the notes of every queue it is given, so it must be given every
    queue the trees of those queues span: it answers ``need`` with the ones it lacks (from
    the queues' tree_queues sets) and the storage calls it again, until closed. Here a
    note on B (tree A-B, left by a crash) is acted on by a settle on C (tree B-C)."""
    from redis_helpers import _done, _job, _prefix

    from trioqueue.storage._base import FlowJob

    prefix = _prefix()
    async with RedisStorage(redis_url, prefix=prefix) as st:
        await st.enqueue_flow([FlowJob("A", _job("p1")), FlowJob("B", _job("c1"), ("A", "p1"))])
        await st.enqueue_flow([FlowJob("B", _job("p2")), FlowJob("C", _job("c2"), ("B", "p2"))])
        [c1] = await st.dequeue("B", "w", 1, 0, 30)

        async def killed(queue: str) -> None:  # the worker dies before tree_act
            pass

        st._trees.act = killed  # type: ignore[method-assign]
        assert await st.settle("B", "w", [_done(c1, b"r1")]) == [True]
    async with RedisStorage(redis_url, prefix=prefix) as st2:  # knows no tree's queues
        calls: list[list[str]] = []
        multi = st2._runner.multi

        def spy(name: str, queues: list[str], args: list[str], shield: float) -> object:
            if name == "tree_act":
                calls.append(list(queues))
            return multi(name, queues, args, shield)

        st2._runner.multi = spy  # type: ignore[method-assign]
        [c2] = await st2.dequeue("C", "w", 1, 0, 30)
        assert await st2.settle("C", "w", [_done(c2, b"r2")]) == [True]
        assert calls == [["C"], ["C", "B"], ["C", "B", "A"]]
        for queue, job_id in (("B", "p2"), ("A", "p1")):
            rec = await st2.get_job(queue, job_id)
            assert rec is not None and rec.state.startswith("queued:"), (queue, job_id, rec)
        [p2] = await st2.dequeue("B", "w", 1, 0, 30)
        assert [(q, r.id, r.result) for q, r in await st2.get_children("B", "p2")] == [("C", "c2", b"r2")]
        await st2.settle("B", "w", [_done(p2)])
        # B's trees span A and C: both learnt from B's tree_queues in one answer
        assert len(calls) == 5 and calls[3] == ["B"] and calls[4][0] == "B" and sorted(calls[4]) == ["A", "B", "C"]


async def test_the_scripts_on_several_queues_load_as_redis_functions(st: RedisStorage) -> None:
    """A library that does not load falls back to EVALSHA with a warning (so the other
    tests would pass anyway): the scripts that act on several queues (a tree across
    queues) must load as Functions (Lua allows a function 60 upvalues, and the library
    form makes a script's leading locals upvalues)."""
    from trioqueue.storage.redis import _lua

    for name in ("flow_enqueue", "flow_add", "tree_act"):
        assert "set_queues(" in _lua.source(name), name
        fn, code = _lua.library(name)
        assert await st._transport.command(["FUNCTION", "LOAD", "REPLACE", code]) in (fn, fn.encode()), name


async def test_flow_add_refuses_children_of_a_job_whose_ancestor_was_cancelled_before_tree_act(redis_url: str) -> None:
    """The process that cancelled a tree's root died before its ``tree_act`` (kill -9):
    p, a running child of the root on another queue, has no cancel request yet. Its
    handler's ``add_children`` (children on a third queue) is refused all the same:
    ``flow_add`` walks up p's ancestors, asking for the root's queue it was not given,
    and finds the root cancelled. Nothing written, nothing to claim."""
    from redis_helpers import _job, _prefix

    from trioqueue.storage._base import FlowJob

    async with RedisStorage(redis_url, prefix=_prefix()) as st:
        await st.enqueue_flow([FlowJob("A", _job("root")), FlowJob("B", _job("p"), ("A", "root"))])
        [run] = await st.dequeue("B", "w", 1, 0, 30)
        tree_act = st._trees.act

        async def killed(queue: str) -> None:  # the process dies before tree_act
            pass

        st._trees.act = killed  # type: ignore[method-assign]
        assert await st.cancel("A", "root") == "cancelled"
        st._trees.act = tree_act  # type: ignore[method-assign]
        reply = await st.heartbeat("B", "w", 30.0, [("p", run.token)], 30.0)
        assert reply.cancel_requested == [] and not reply.lost, reply
        calls: list[list[str]] = []
        multi = st._runner.multi

        def spy(name: str, queues: list[str], args: list[str], shield: float) -> object:
            if name == "flow_add":
                calls.append(list(queues))
            return multi(name, queues, args, shield)

        st._runner.multi = spy  # type: ignore[method-assign]
        kids = [FlowJob("C", _job("kid"), ("B", "p")), FlowJob("C", _job("grandkid"), ("C", "kid"))]
        assert await st.add_children("B", "w", "p", run.token, kids, "cancel") is False
        assert calls == [["B", "C"], ["B", "C", "A"]]
        assert await st.dequeue("C", "w2", 10, 0, 30) == []
        assert await st.get_job("C", "kid") is None and await st.get_job("C", "grandkid") is None


async def test_a_first_claim_writes_the_metadata_a_later_claim_reads_back_whole(st: RedisStorage) -> None:
    """A job's first claim writes its metadata as text (the enqueue's fields, the attempts in
    place, then the claim's): the fields read back are those of the JSON encoder's form,
    for a started claim, a reserved one, and a job with a priority and a group; a second
    claim (after a release) starts from them."""
    import json

    from trioqueue.storage import NewJob

    await st.enqueue("q", [_job("a"), _job("b"), NewJob("c", b"e", 5, 60.0, "t-c", priority=2, group='g"1')])
    claims = {c.id: c for c in await st.dequeue("q", "w:1", 3, 0, 30, 1)}  # the first started, two reserved
    meta = st._runner.key("q", "meta")
    raw = {i: await st._transport.command(["HGET", meta, i]) for i in "abc"}
    m = {i: json.loads(v) for i, v in raw.items()}
    for i in "abc":
        assert m[i]["n"] == 1 and m[i]["w"] == "w:1" and m[i]["l"] == claims[i].token == f"t-{i}.1", m[i]
        assert m[i]["i"] == f"t-{i}" and m[i]["k"], m[i]
        assert raw[i].count(b'"a":') == 1, raw[i]  # the attempts written once, in place
    started = [i for i in "abc" if claims[i].started]
    assert len(started) == 1
    for i in "abc":
        assert (m[i]["a"], m[i].get("s")) == ((1, 1) if i in started else (0, None)), m[i]
    assert (m["c"]["p"], m["c"]["g"], m["c"]["m"]) == (2, 'g"1', 5)
    assert await st.release("q", "w:1", ["a", "b", "c"], refund=True) == 3
    again = {c.id: c for c in await st.dequeue("q", "w:2", 3, 0, 30, 3)}
    assert sorted(again) == ["a", "b", "c"]
    for i in "abc":
        m2 = json.loads(await st._transport.command(["HGET", meta, i]))
        assert (m2["n"], m2["w"], m2["s"], m2["l"]) == (2, "w:2", 1, f"t-{i}.2"), m2
        assert again[i].attempts == 1, (i, again[i])
