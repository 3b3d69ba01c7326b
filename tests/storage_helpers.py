"""Helpers of the storage conformance suite (tests/conformance/test_storage*.py), also imported by the
other storage-level tests.

``W1`` and ``W2`` are worker ids, ``LEASE`` a claim's lease; ``job`` makes a NewJob;
``claim`` claims as a worker would and remembers the claim tokens that ``settlement``
fences its settlements with; ``kind`` is a state's kind; ``mixed_lifecycle`` takes a queue
through the events of ``MIXED_EVENTS``.
"""

from __future__ import annotations

from trioqueue._core import encode_envelope, parse_state
from trioqueue.storage import Claim, NewJob, Settlement, SettleKind, Storage


W1 = "worker:one"  # worker ids may contain ':'
W2 = "worker-two"
LEASE = 30.0


def job(job_id: str, payload: bytes = b"{}", *, max_attempts: int = 3, ttl: float = 60.0, token: str = "") -> NewJob:
    env = encode_envelope(job_id, payload, 1_700_000_000_000, 0, max_attempts, int(ttl * 1000))
    return NewJob(job_id, env, max_attempts, ttl, token or f"t-{job_id}")


# Claim tokens of the claims made through ``claim``, by (queue, job id): ``settlement``
# fences with the latest one, as a worker would.
TOKENS: dict[tuple[str, str], str] = {}


async def claim(
    storage: Storage, q: str, worker: str = W1, n: int = 10, timeout: float = 0.05, lease: float = LEASE, start=None
) -> list[Claim]:
    claims = await storage.dequeue(q, worker, n, timeout, lease, start)
    TOKENS.update(((q, c.id), c.token) for c in claims)
    return claims


def settlement(kind: SettleKind, q: str, job_id: str, data: bytes, **kw: float) -> Settlement:
    return Settlement(kind, job_id, data, token=TOKENS.get((q, job_id), ""), **kw)


def kind(state: str) -> str:
    return parse_state(state)[0]


# The events of :func:`mixed_lifecycle`, in order.
MIXED_EVENTS = [
    ("enqueued", "a"),
    ("enqueued", "b"),
    ("enqueued", "c"),
    ("completed", "a"),
    ("failing", "b"),
    ("due", ""),  # b's retry is the first job of the delayed set
    ("cancelled", "c"),
    ("fenced", "zz"),
]


async def mixed_lifecycle(storage: Storage, q: str) -> None:
    """Enqueue a, b and c; complete a, retry b (in 60 s: a ``due`` notice), cancel c;
    settle zz, which W1 never held (fenced): the events of :data:`MIXED_EVENTS`."""
    await storage.enqueue(q, [job("a"), job("b"), job("c")])
    await claim(storage, q, n=2)
    await storage.settle(
        q,
        W1,
        [
            settlement(SettleKind.COMPLETE, q, "a", b'"ra"', ttl=60),
            settlement(SettleKind.RETRY, q, "b", b'{"type":"E","message":"m","traceback":""}', delay=60),
        ],
    )
    await storage.cancel(q, "c")
    await storage.settle(q, W1, [settlement(SettleKind.COMPLETE, q, "zz", b"1", ttl=60)])
