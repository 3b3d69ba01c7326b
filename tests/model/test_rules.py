"""The lifecycle rules (``trioqueue.storage._rules``) on their own: the state grammar
against the Rust codec, the transition table, the attempt accounting and the reaper's
retry-or-fail decision, and the tree policies. No storage, no I/O."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioqueue._core import StateError, format_state, parse_state
from trioqueue._model._serde import decode_error
from trioqueue._model._types import CancelStatus
from trioqueue.storage import _rules as R
from trioqueue.storage._rules import SettleKind


def _rec(kind: str = R.QUEUED, max_attempts: int = 3) -> R.Rec:
    return R.Rec("j1", kind, 1_000, 0, max_attempts, 60.0, 1_000, b"env", token="t")


def _claimed(start: bool = True, max_attempts: int = 3) -> R.Rec:
    r = _rec(max_attempts=max_attempts)
    R.claim(r, "w1", 2_000, 10.0, start)
    return r


def _snapshot(r: R.Rec) -> dict[str, object]:
    return {name: getattr(r, name) for name in R.Rec.__slots__}


# -- the grammar: owned here, the Rust codec verified against it ---------------------------

_EXTRA = {None: None, "worker": "host:1:w", "attempts": 3, "due_ms": 1_700_000_000_123}


def test_the_rust_codec_knows_exactly_the_kinds_of_the_table_but_the_waiting_ones() -> None:
    with pytest.raises(StateError) as err:
        format_state("nope", 1)
    listed = re.search(r"expected one of ([a-z_, ]+)\)", str(err.value))
    assert listed is not None, str(err.value)
    rust_kinds = {k.strip() for k in listed.group(1).split(",")}
    assert rust_kinds == set(R.STATE_KINDS) - {R.WAITING_CHILDREN, R.WAITING_SIGNAL}
    with pytest.raises(StateError):
        parse_state("waiting_children:5")  # read and written by the rules only
    with pytest.raises(StateError):
        parse_state("waiting_signal:5")


@pytest.mark.parametrize("kind", R.STATE_KINDS)
def test_every_kind_round_trips_with_the_field_the_table_gives(kind: str) -> None:
    extra = _EXTRA[R.KIND_FIELDS[kind]]
    text = R.format_job_state(kind, 42, extra)
    assert R.parse_job_state(text) == (kind, 42, extra)
    if kind not in (R.WAITING_CHILDREN, R.WAITING_SIGNAL):
        assert parse_state(format_state(kind, 42, extra)) == (kind, 42, extra)


def test_the_kind_tables_agree() -> None:
    assert set(R.KIND_FIELDS) == set(R.STATE_KINDS)
    assert set(R.TERMINAL_KINDS) | set(R.ACTIVE_KINDS) == set(R.STATE_KINDS)
    assert set(R.CANCELLABLE) < set(R.ACTIVE_KINDS)
    for step, table in R.TRANSITIONS.items():
        for old, news in table.items():
            assert old is None or old in R.STATE_KINDS, step
            assert set(news) <= set(R.STATE_KINDS), step
    # nothing leaves a terminal kind but a new incarnation (enqueue, retry_job)
    for step, table in R.TRANSITIONS.items():
        if step not in ("enqueue", "retry_job"):
            assert not set(table) & {R.COMPLETED, R.FAILED}, step


@given(st.integers(0, 2**64 - 1), st.sampled_from(R.STATE_KINDS))
def test_state_strings_round_trip(ms: int, kind: str) -> None:
    extra = _EXTRA[R.KIND_FIELDS[kind]]
    assert R.parse_job_state(R.format_job_state(kind, ms, extra)) == (kind, ms, extra)


# -- the transition table ------------------------------------------------------------------


@pytest.mark.parametrize("kind", [k for k in R.STATE_KINDS if k != R.QUEUED])
def test_only_a_queued_job_is_claimed(kind: str) -> None:
    r = _rec(kind)
    before = _snapshot(r)
    with pytest.raises(R.TransitionError, match=r"job 'j1': claim of a \w+ job"):
        R.claim(r, "w1", 2_000, 10.0, True)
    assert _snapshot(r) == before  # refused: nothing changed


@pytest.mark.parametrize("kind", [k for k in R.STATE_KINDS if k != R.PROCESSING])
@pytest.mark.parametrize("skind", list(SettleKind))
def test_only_a_processing_job_is_settled(kind: str, skind: SettleKind) -> None:
    r = _rec(kind)
    before = _snapshot(r)
    with pytest.raises(R.TransitionError, match="settle of a"):
        R.settle(r, skind, b"x", 5.0, 60.0)
    with pytest.raises(R.TransitionError):
        R.recover(r, 5.0, "w1")
    with pytest.raises(R.TransitionError):
        R.release(r, 5.0, False)
    assert _snapshot(r) == before


@pytest.mark.parametrize("kind", [k for k in R.STATE_KINDS if k not in (R.FAILING, R.DELAYED, R.WAITING_SIGNAL)])
def test_only_a_due_retry_or_delayed_job_is_promoted(kind: str) -> None:
    with pytest.raises(R.TransitionError, match="promote of a"):
        R.promote(_rec(kind), 5_000)


def test_promotion_names_what_came_due() -> None:
    assert R.promote(_rec(R.FAILING), 5_000) == "requeued"
    r = _rec(R.DELAYED)
    assert R.promote(r, 5_000) == "promoted"
    assert (r.kind, r.ts) == (R.QUEUED, 5_000)


def test_a_parent_is_released_only_from_waiting() -> None:
    with pytest.raises(R.TransitionError, match="release_parent may not take a queued job"):
        R.release_parent(_rec(R.QUEUED), 5)
    r = _rec(R.WAITING_CHILDREN)
    R.release_parent(r, 5)
    assert r.kind == R.QUEUED


_STEPS = ["claim", "start", "complete", "fail", "retry", "rate_limited", "sleep", "wait", "cancel_settle", "release",
          "recover", "promote", "cancel", "release_parent", "fail_by_children"]  # fmt: skip


def _step(r: R.Rec, step: str, paused: bool) -> None:
    now = 10.0
    if step == "claim":
        R.claim(r, "w1", 10_000, 20.0, not paused)
    elif step == "start":
        R.start(r, paused, now)
    elif step in ("complete", "fail", "retry", "rate_limited", "sleep", "wait", "cancel_settle"):
        skind = {"complete": SettleKind.COMPLETE, "fail": SettleKind.FAIL, "retry": SettleKind.RETRY,
                 "rate_limited": SettleKind.RATE_LIMITED, "sleep": SettleKind.SLEEP, "wait": SettleKind.WAIT_CHILDREN,
                 "cancel_settle": SettleKind.CANCEL}[step]  # fmt: skip
        R.settle(r, skind, b"data", now, 60.0)
    elif step == "release":
        R.release(r, now, paused)
    elif step == "recover":
        R.recover(r, now, "w1")
    elif step == "promote":
        R.promote(r, 10_000)
    elif step == "cancel":
        R.cancel(r, now)
    elif step == "release_parent":
        R.release_parent(r, 10_000)
    else:
        R.fail_by_children(r, [("c1", b"")], now)


_STEP_NAME = {"complete": "settle", "fail": "settle", "retry": "settle", "rate_limited": "settle", "sleep": "settle",
              "wait": "settle", "cancel_settle": "settle"}  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_STEPS), st.booleans()), max_size=30), st.integers(1, 4))
def test_any_walk_moves_only_along_the_table(walk: list[tuple[str, bool]], max_attempts: int) -> None:
    """A record walked by any sequence of steps: each step either moves it to a kind its
    row of the table allows (and keeps the attempt accounting sane), or refuses with a
    TransitionError and changes nothing."""
    r = _rec(max_attempts=max_attempts)
    for step, flag in walk:
        before = _snapshot(r)
        try:
            _step(r, step, flag)
        except R.TransitionError:
            assert _snapshot(r) == before, step
            continue
        name = _STEP_NAME.get(step, step)
        old = before["kind"]
        if r.kind != old or name not in ("start", "cancel"):
            assert r.kind in R.TRANSITIONS[name].get(old, ()), (step, old, r.kind)  # type: ignore[call-overload]
        assert r.kind in R.STATE_KINDS
        assert 0 <= r.attempts <= r.claims
        if r.kind == R.PROCESSING:
            assert r.worker == "w1" and r.claim == f"t.{r.claims}" and r.lease is not None
        else:
            assert r.worker is None and r.lease is None
        assert (r.exp is not None) == (r.kind in R.TERMINAL_KINDS)


# -- attempts and the retry-or-fail decision -----------------------------------------------


def test_a_claim_counts_its_attempt_at_once_or_when_started() -> None:
    r = _rec()
    assert R.claim(r, "w1", 2_000, 10.0, True) == 1 and r.attempts == 1 and r.started
    r2 = _rec()
    assert R.claim(r2, "w1", 2_000, 10.0, False) == 1 and r2.attempts == 0 and not r2.started
    assert R.start(r2, False, 3.0) == "run" and r2.attempts == 1
    assert R.start(r2, False, 3.0) == "run" and r2.attempts == 1  # started once
    assert r2.claim == "t.1"


def test_a_reserved_claim_settled_without_start_counts_its_attempt() -> None:
    r = _claimed(start=False)
    assert R.settle(r, SettleKind.COMPLETE, b"ok", 5.0, 60.0) == "completed"
    assert (r.kind, r.attempts, r.result, r.exp) == (R.COMPLETED, 1, b"ok", 65.0)


@pytest.mark.parametrize("skind", [SettleKind.RATE_LIMITED, SettleKind.WAIT_CHILDREN, SettleKind.SLEEP])
def test_a_rate_limited_waiting_or_sleeping_run_does_not_count(skind: SettleKind) -> None:
    r = _claimed()
    event = R.settle(r, skind, b"", 5.0)
    assert r.attempts == 0
    assert r.kind == (R.WAITING_CHILDREN if skind is SettleKind.WAIT_CHILDREN else R.DELAYED)
    assert event == {SettleKind.RATE_LIMITED: "rate_limited", SettleKind.WAIT_CHILDREN: None, SettleKind.SLEEP: "sleeping"}[skind]


def test_a_sleeping_run_with_a_cancel_request_ends_cancelled() -> None:
    r = _claimed()
    r.cancel_requested = True
    assert R.settle(r, SettleKind.SLEEP, b"", 5.0) == "cancelled"
    assert r.kind == R.CANCELLED


def test_a_retry_keeps_its_error_and_fails_nothing() -> None:
    r = _claimed()
    assert R.settle(r, SettleKind.RETRY, b"err", 5.0) == "failing"
    assert (r.kind, r.error, r.attempts, r.exp) == (R.FAILING, b"err", 1, None)


def test_a_cancel_request_turns_any_put_back_into_cancelled() -> None:
    for skind in R.BACK:
        r = _claimed()
        r.cancel_requested = True
        assert R.settle(r, skind, b"", 5.0) == "cancelled"
        assert r.kind == R.CANCELLED and r.exp == 65.0
    r = _claimed()
    r.cancel_requested = True
    assert R.settle(r, SettleKind.COMPLETE, b"ok", 5.0, 1.0) == "completed"  # its end stands


def test_a_parent_whose_child_failed_under_cancel_cannot_complete() -> None:
    r = _claimed()
    assert R.settle(r, SettleKind.COMPLETE, b"ok", 5.0, by_children=R.failed_by_children("cancel", True)) is None
    assert r.kind == R.WAITING_CHILDREN  # ... and the tree fails it: parent_verdict says fail
    assert R.parent_verdict(r.kind, "cancel", True, 0) == R.FAIL
    r = _claimed()
    R.settle(r, SettleKind.FAIL, b"own", 5.0, by_children=True)
    assert r.kind == R.FAILED and r.error == b"own"  # a failure of its own stands


def test_a_parent_whose_child_failed_under_cancel_does_not_wait_for_a_signal() -> None:
    r = _claimed()
    assert R.settle(r, SettleKind.WAIT_SIGNAL, R.WaitSignal("go", 1).encode(), 5.0, by_children=True) is None
    assert r.kind == R.WAITING_CHILDREN and r.wait is None  # the tree fails it
    r = _claimed()
    R.settle(r, SettleKind.WAIT_SIGNAL, R.WaitSignal("go", 1).encode(), 5.0)
    assert R.parent_verdict(r.kind, "cancel", True, 1) == R.FAIL  # one failed while it waited
    R.fail_by_children(r, [("c1", b"")], 6.0)
    assert r.kind == R.FAILED and r.wait is None


def test_stalled_jobs_go_back_while_attempts_are_left_then_fail() -> None:
    r = _claimed(max_attempts=2)
    assert R.recover(r, 5.0, "w1") == "requeued"
    assert (r.kind, r.attempts, r.claim, r.started) == (R.QUEUED, 1, None, False)
    R.claim(r, "w2", 6_000, 20.0, True)
    assert R.recover(r, 7.0, "w2") == "failed"
    assert r.kind == R.FAILED and r.exp == 67.0
    error = decode_error(r.error or b"")
    assert error.type == "StalledJobError" and "'w2'" in error.message and "all 2 attempts" in error.message


def test_a_stalled_reserved_claim_goes_back_at_no_cost() -> None:
    r = _claimed(start=False, max_attempts=1)
    r.attempts = 1  # its one attempt used by an earlier claim
    assert R.recover(r, 5.0, "w1") == "requeued"
    assert r.attempts == 1


def test_a_stalled_job_with_a_cancel_request_ends_cancelled() -> None:
    r = _claimed()
    r.cancel_requested = True
    assert R.recover(r, 5.0, "w1") == "cancelled"
    assert r.kind == R.CANCELLED


def test_release_refunds_only_when_asked_and_honours_a_cancel_request() -> None:
    r = _claimed()
    assert R.release(r, 5.0, refund=False) == R.QUEUED and r.attempts == 1
    R.claim(r, "w1", 6_000, 20.0, True)
    assert R.release(r, 6.0, refund=True) == R.QUEUED and r.attempts == 1  # the second attempt given back
    R.claim(r, "w1", 7_000, 20.0, True)
    r.cancel_requested = True
    assert R.release(r, 7.0, refund=False) == R.CANCELLED and r.kind == R.CANCELLED


def test_release_of_a_started_claim_at_its_last_attempt_fails_it_unless_refunded() -> None:
    r = _claimed()
    r.max_attempts = 1
    assert R.release(r, 5.0, refund=True) == R.QUEUED and r.attempts == 0
    R.claim(r, "w1", 6_000, 20.0, True)
    assert R.release(r, 6.0, refund=False, worker_id="w1") == R.FAILED and r.kind == R.FAILED
    assert r.claim is None and r.worker is None


def test_start_of_a_reserved_claim_when_paused_or_cancelled() -> None:
    r = _claimed(start=False)
    assert R.start(r, True, 5.0) == "back" and r.kind == R.QUEUED and r.attempts == 0
    r = _claimed(start=False)
    r.cancel_requested = True
    assert R.start(r, False, 5.0) == R.CANCELLED and r.kind == R.CANCELLED and r.attempts == 0
    r = _claimed(start=True)
    assert R.start(r, True, 5.0) == "run"  # a started claim runs on, paused or not


def test_settled_before_tells_a_retried_settlement_from_a_fenced_one() -> None:
    r = _claimed()
    assert not R.settled_before(r, "t.1")  # still held: not settled yet
    R.settle(r, SettleKind.COMPLETE, b"ok", 5.0, 60.0)
    assert R.settled_before(r, "t.1")
    assert not R.settled_before(r, "t.2")
    assert not R.settled_before(None, "t.1")


def test_cancel_statuses() -> None:
    assert R.cancel(None, 1.0) == (CancelStatus.NOT_FOUND, None)
    for kind in R.CANCELLABLE:
        r = _rec(kind)
        assert R.cancel(r, 1.0) == (CancelStatus.CANCELLED, "cancelled") and r.kind == R.CANCELLED
        assert R.cancel(r, 2.0) == (CancelStatus.CANCELLED, None)  # once
    r = _claimed()
    assert R.cancel(r, 1.0) == (CancelStatus.CANCELLED, "cancel_requested") and r.kind == R.PROCESSING
    assert R.cancel(r, 1.0) == (CancelStatus.CANCELLED, None)
    for kind, status in ((R.COMPLETED, CancelStatus.COMPLETED), (R.FAILED, CancelStatus.FAILED)):
        assert R.cancel(_rec(kind), 1.0) == (status, None)


def test_enqueue_replaces_only_a_cancelled_or_missing_job() -> None:
    assert R.replaceable(None) and R.replaceable(_rec(R.CANCELLED))
    assert not any(R.replaceable(_rec(k)) for k in R.STATE_KINDS if k != R.CANCELLED)
    done = _rec(R.COMPLETED)
    done.result = b"r"
    assert R.existing_outcome(done) == b"r" and R.existing_outcome(_rec(R.QUEUED)) is None
    assert R.enqueue_kind(None, 5.0) == R.QUEUED and R.enqueue_kind(5.0, 5.0) == R.QUEUED
    assert R.enqueue_kind(5.1, 5.0) == R.DELAYED


# -- trees -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "policy", "failed", "pending", "cancel_requested", "ancestor_ended", "verdict"),
    [
        (R.WAITING_CHILDREN, "cancel", False, 2, False, False, R.NOTHING),
        (R.WAITING_CHILDREN, "cancel", False, 0, False, False, R.RELEASE),
        (R.WAITING_CHILDREN, "cancel", True, 2, False, False, R.FAIL),
        (R.WAITING_CHILDREN, "continue", True, 2, False, False, R.NOTHING),
        (R.WAITING_CHILDREN, "continue", True, 0, False, False, R.RELEASE),
        (R.WAITING_CHILDREN, "ignore", True, 0, False, False, R.RELEASE),
        (R.WAITING_CHILDREN, "cancel", False, 0, False, True, R.CANCELLED),
        (R.PROCESSING, "cancel", True, 1, False, False, R.CANCEL_CHILDREN),
        (R.PROCESSING, "continue", True, 1, False, False, R.NOTHING),
        (R.PROCESSING, "continue", False, 1, True, False, R.CANCEL_CHILDREN),
        (R.PROCESSING, "cancel", False, 0, False, False, R.NOTHING),
        (R.QUEUED, "cancel", True, 0, False, False, R.FAIL),
        (R.FAILING, "cancel", True, 0, False, False, R.FAIL),
        (R.DELAYED, "continue", True, 0, False, False, R.NOTHING),
        (R.WAITING_SIGNAL, "cancel", True, 1, False, False, R.FAIL),
        (R.WAITING_SIGNAL, "cancel", True, 1, False, True, R.CANCELLED),
        (R.WAITING_SIGNAL, "continue", True, 0, False, False, R.NOTHING),
        (R.WAITING_SIGNAL, "cancel", False, 0, False, False, R.NOTHING),
        (R.COMPLETED, "cancel", True, 0, False, False, R.NOTHING),
        (R.CANCELLED, "cancel", True, 0, False, False, R.NOTHING),
    ],
)
def test_parent_verdicts(
    kind: str, policy: str, failed: bool, pending: int, cancel_requested: bool, ancestor_ended: bool, verdict: str
) -> None:
    assert R.parent_verdict(kind, policy, failed, pending, cancel_requested, ancestor_ended) == verdict


@given(st.sampled_from(R.STATE_KINDS), st.sampled_from(["cancel", "continue", "ignore"]), st.booleans(),
       st.integers(0, 5), st.booleans(), st.booleans())  # fmt: skip
def test_a_verdict_is_always_a_move_the_table_allows(
    kind: str, policy: str, failed: bool, pending: int, cancel_requested: bool, ancestor_ended: bool
) -> None:
    verdict = R.parent_verdict(kind, policy, failed, pending, cancel_requested, ancestor_ended)
    step = {R.FAIL: "fail_by_children", R.RELEASE: "release_parent", R.CANCELLED: "cancel_by_ancestor"}.get(verdict)
    if step is not None:
        assert kind in R.TRANSITIONS[step]
    if verdict == R.CANCEL_CHILDREN:
        assert kind == R.PROCESSING
    if policy != "cancel" and not cancel_requested:
        assert verdict not in (R.FAIL, R.CANCEL_CHILDREN)  # continue/ignore: a child's failure changes nothing


def test_a_parent_failed_by_its_children_lists_their_errors() -> None:
    r = _rec(R.WAITING_CHILDREN)
    R.fail_by_children(r, [("c1", b""), ("c2", b"")], 5.0)
    assert r.kind == R.FAILED and r.exp == 65.0
    error = decode_error(r.error or b"")
    assert error.type == "ChildJobFailedError"
    assert "c1: JobCancelledError" in error.message and "'j1'" in error.message


def test_only_a_parent_that_completed_lets_its_children_run_on() -> None:
    assert not R.ended_cancels_children(R.COMPLETED)
    assert R.ended_cancels_children(R.FAILED) and R.ended_cancels_children(R.CANCELLED)


# -- debounce and retention -------------------------------------------------------------------


def test_debounce_moves_a_delayed_job_but_never_past_max_wait() -> None:
    r = _rec(R.DELAYED)  # created at 1.0 s
    assert R.debounces(r) and R.debounces(_rec(R.QUEUED)) and not R.debounces(_claimed())
    assert R.debounce(r, b"new", 5, 9.0, now=2.0, delay=3.0, max_wait=None) == 5.0
    assert (r.envelope, r.max_attempts, r.result_ttl) == (b"new", 5, 9.0)
    assert R.debounce(r, b"new", 5, 9.0, now=2.0, delay=3.0, max_wait=2.5) == 3.5  # created + max_wait
    assert R.debounce(_rec(R.QUEUED), b"x", 1, 1.0, now=2.0, delay=3.0, max_wait=None) is None
    assert R.debounce_delay(3.0, None) == 3.0 and R.debounce_delay(3.0, 1.0) == 1.0


def test_retention_rules() -> None:
    r = _rec(R.COMPLETED)
    assert R.ttl_update_status(r.kind, None, None) is not None  # no result to keep
    assert R.ttl_update_status(r.kind, b"r", None) is None
    assert R.ttl_update_status(R.CANCELLED, None, None) is None
    assert R.ttl_update_status(R.QUEUED, None, None) is not None
    assert R.ttl_update_status(None, None, None) is not None
    r.exp = 5.0
    assert R.is_expired(r, 5.0) and not R.is_expired(r, 4.9)
    assert not R.in_tree(r)
    r.parent = ("q", "p")
    assert R.in_tree(r)
    assert R.retryable(_rec(R.FAILED)) and R.retryable(_rec(R.CANCELLED)) and not R.retryable(_rec(R.COMPLETED))
    assert R.removable(_rec(R.COMPLETED)) and not R.removable(_claimed()) and not R.removable(None)


# -- signals -------------------------------------------------------------------------------


def test_a_wait_for_a_signal_parks_uncounted_and_its_signal_queues_it() -> None:
    from trioqueue.storage._steps import encode_step

    r = _claimed()
    assert r.attempts == 1
    event = R.settle(r, SettleKind.WAIT_SIGNAL, R.WaitSignal("go", 1, 5_000).encode(), 3.0)
    assert event == "waiting_signal" and r.kind == R.WAITING_SIGNAL and r.attempts == 0 and not r.started
    assert r.wait == ("go", 1) and r.state() == "waiting_signal:3000"
    assert R.parse_job_state(r.state()) == (R.WAITING_SIGNAL, 3_000, None)
    assert R.signal(r, encode_step("other", b"1"), 4_000) == "delivered" and r.kind == R.WAITING_SIGNAL
    assert R.signal(r, encode_step("go", b"2"), 4_000) == "woken"
    assert r.kind == R.QUEUED and r.wait is None and r.ts == 4_000
    assert R.signal(r, encode_step("go", b"3"), 4_000) == "delivered"  # kept for a later wait
    assert R.count_signals(r.signals, "go") == 2


def test_a_wait_whose_signals_arrived_is_queued_at_once_and_a_cancel_request_wins() -> None:
    from trioqueue.storage._steps import encode_step

    r = _claimed()
    R.signal(r, encode_step("go", b"1"), 2_500)
    assert R.settle(r, SettleKind.WAIT_SIGNAL, R.WaitSignal("go", 1).encode(), 3.0) == "requeued"
    assert r.kind == R.QUEUED and r.attempts == 0
    r = _claimed()
    R.request_cancel(r)
    assert R.settle(r, SettleKind.WAIT_SIGNAL, R.WaitSignal("go", 1).encode(), 3.0) == "cancelled"


def test_a_waiting_job_is_promoted_at_its_deadline_cancelled_and_refuses_signals_once_ended() -> None:
    from trioqueue.storage._steps import encode_step

    r = _claimed()
    R.settle(r, SettleKind.WAIT_SIGNAL, R.WaitSignal("go", 1, 5_000).encode(), 3.0)
    assert R.promote(r, 5_000) == "promoted" and r.kind == R.QUEUED and r.wait is None
    r = _claimed()
    R.settle(r, SettleKind.WAIT_SIGNAL, R.WaitSignal("go", 1).encode(), 3.0)
    assert R.cancel(r, 4.0) == (CancelStatus.CANCELLED, "cancelled")
    assert R.signal(r, encode_step("go", b"1"), 4_000) == "not_found" and r.signals is None
    assert R.signal(None, encode_step("go", b"1"), 4_000) == "not_found"
