"""The worked example of the durable-jobs guide (docs/durable.md, "An order, end to end"),
run under the virtual clock on MemoryStorage: an order is charged once, waits up to three
days for its shipping signal without holding a worker, sleeps an hour, then mails; an
order that is never shipped is refunded after three days and fails."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from trioqueue import Job, JobState, JobStatus, MemoryStorage, Queue, Reaper, SignalTimeoutError, UnrecoverableError

HOUR = 3600.0
DAY = 24 * HOUR
# (as in test_virtual_clock: long leases and claim waits, and no scheduler polling every
# virtual second: each wake-up costs real time)
NO_SCHEDULER: dict[str, Any] = {"reaper": False, "visibility_timeout": HOUR, "block_timeout": HOUR}


class Shop:
    """The outside world the handler changes: every effect is recorded with its virtual time."""

    def __init__(self) -> None:
        self.effects: list[tuple[str, str, float]] = []

    def charge(self, order_id: str, amount: int) -> str:
        self.effects.append(("charge", order_id, trio.current_time()))
        return f"receipt-{order_id}"

    def refund(self, receipt: str) -> None:
        self.effects.append(("refund", receipt, trio.current_time()))

    async def mail(self, email: str, tracking: str) -> None:
        self.effects.append(("mail", f"{email}:{tracking}", trio.current_time()))


async def reach(queue: Queue[Any, Any], job_id: str, state: JobState) -> JobStatus:
    """``job_id``'s status once it is in ``state`` (woken by the job's events)."""
    async for status in queue.watch(job_id):
        assert status is not None, job_id
        if status.state is state:
            return status
    raise AssertionError(f"{job_id} ended without reaching {state}")


def fulfil_order(shop: Shop) -> Any:
    # (the handler as docs/durable.md gives it, with its services passed in)
    async def fulfil(job: Job[dict[str, Any]]) -> str:
        order = job.payload
        receipt = await job.step("charge", shop.charge, job.id, order["amount"])
        try:
            shipped = await job.wait_for_signal("shipped", timeout=3 * DAY)
        except SignalTimeoutError:
            await job.step("refund", shop.refund, receipt)
            raise UnrecoverableError(f"order {job.id} was not shipped within 3 days") from None
        await job.sleep("cool-off", HOUR)
        await job.step("mail", shop.mail, order["email"], shipped["tracking"])
        return receipt

    return fulfil


async def test_the_guides_order_is_charged_once_waits_for_shipping_sleeps_and_mails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    shop = Shop()
    start = trio.current_time()
    storage = MemoryStorage()
    async with (
        Reaper(storage, visibility_timeout=HOUR, scan_interval=HOUR / 10, scheduler=False),
        Queue(storage, name="orders", handler=fulfil_order(shop), concurrency=1, **NO_SCHEDULER) as orders,
    ):
        await orders.enqueue("order-42", {"amount": 1999, "email": "ada@example.com"})
        await orders.enqueue("order-43", {"amount": 500, "email": "bob@example.com"})
        with trio.fail_after(DAY):
            for job_id in ("order-42", "order-43"):
                await reach(orders, job_id, JobState.WAITING_SIGNAL)
        await trio.sleep(DAY)  # a day later, order-42 ships
        assert await orders.signal("order-42", "shipped", {"tracking": "1Z999"}) == "delivered"
        shipped_at = trio.current_time()
        with trio.fail_after(HOUR / 2):
            asleep = await reach(orders, "order-42", JobState.DELAYED)  # the hour's cool-off
        assert asleep.attempts == 0 and [name for name in asleep.steps] == ["charge", "cool-off"]
        with trio.fail_after(4 * DAY):
            done = await reach(orders, "order-42", JobState.COMPLETED)
            failed = await reach(orders, "order-43", JobState.FAILED)
        assert done.result == "receipt-order-42"
        assert failed.error is not None and "not shipped within 3 days" in failed.error.message
        assert done.attempts == 1  # waiting and sleeping used no attempt
    kinds = [(kind, what) for kind, what, _ in shop.effects]
    assert kinds.count(("charge", "order-42")) == 1 and kinds.count(("charge", "order-43")) == 1
    (mail_at,) = [t for kind, what, t in shop.effects if kind == "mail"]
    assert mail_at >= shipped_at + HOUR  # the hour's sleep never woke early
    (refund_at,) = [t for kind, _, t in shop.effects if kind == "refund"]
    assert refund_at - start >= 3 * DAY
