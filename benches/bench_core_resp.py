"""Part of benches/bench_core.py: the Rust RESP codec against its plain-Python twins.

``encode_command`` (a command as redis-py packs it) and ``RespReader`` (incremental
replies: an integer, a claim script's 100-job reply).
"""

from __future__ import annotations

from collections.abc import Callable

from trioqueue import _core

from core_timing import Table, ops_per_s


def py_encode_command(args: list[bytes | str]) -> bytes:
    """The plain-Python twin of ``_core.encode_command`` (as redis-py packs a command)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode() if isinstance(a, str) else a
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class PyRespReader:
    """The plain-Python twin of ``_core.RespReader`` (RESP2, incremental)."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> None:
        self.buf += data

    def _parse(self, pos: int) -> tuple[object, int] | None:
        buf = self.buf
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        kind, body = buf[pos : pos + 1], buf[pos + 1 : end]
        nxt = end + 2
        if kind == b"+":
            return body.decode(), nxt
        if kind == b":":
            return int(body), nxt
        if kind == b"$":
            n = int(body)
            if n < 0:
                return None, nxt
            if len(buf) < nxt + n + 2:
                return None
            return buf[nxt : nxt + n], nxt + n + 2
        if kind == b"*":
            n = int(body)
            if n < 0:
                return None, nxt
            items = []
            for _ in range(n):
                got = self._parse(nxt)
                if got is None:
                    return None
                items.append(got[0])
                nxt = got[1]
            return items, nxt
        if kind == b"-":
            return Exception(body.decode()), nxt
        raise ValueError("not RESP")

    def pop_all(self) -> list[object]:
        out = []
        pos = 0
        while pos < len(self.buf):
            got = self._parse(pos)
            if got is None:
                break
            out.append(got[0])
            pos = got[1]
        self.buf = self.buf[pos:]
        return out


def _claim_reply(jobs: int) -> bytes:
    """A claim script's reply: an array of (id, envelope, token, attempts) per job."""
    items = []
    for i in range(jobs):
        for f in (b"job-%06d" % i, b"\x01" + b"x" * 63, b"%012x-%x" % (i, i)):
            items.append(b"$%d\r\n%s\r\n" % (len(f), f))
        items.append(b":%d\r\n" % (i % 3))
    return b"*%d\r\n" % (jobs * 4) + b"".join(items)


def bench_resp(t: Table, rounds: int, n: int) -> None:
    keys = [f"{{trioqueue:q}}:k{i}" for i in range(28)]
    args = ["EVALSHA", "a" * 40, "28", *keys, "job-1", "\x01" + "x" * 63, "tok", "3", "60000"]
    assert _core.encode_command(args) == py_encode_command(args)
    loops = range(max(1, n // 4))

    def enc(f: Callable[[list], bytes]) -> Callable[[], int]:
        def go() -> int:
            for _ in loops:
                f(args)
            return len(loops)

        return go

    t.add("resp", "encode_command, a 36-argument EVALSHA", ops_per_s(enc(_core.encode_command), rounds),
          "bytes formatting + join", ops_per_s(enc(py_encode_command), rounds))
    for label, data in (("an integer reply", b":1\r\n"), ("a 100-job claim reply", _claim_reply(100))):
        r, p = _core.RespReader(), PyRespReader()
        r.feed(data)
        p.feed(data)
        assert r.pop_all() == p.pop_all()
        per = max(1, n // (4 * max(1, len(data) // 64)))

        def dec(make: Callable[[], object]) -> Callable[[], int]:
            def go() -> int:
                reader = make()
                for _ in range(per):
                    reader.feed(data)  # type: ignore[attr-defined]
                    reader.pop_all()  # type: ignore[attr-defined]
                return per

            return go

        t.add("resp", f"RespReader feed + pop_all, {label}", ops_per_s(dec(_core.RespReader), rounds),
              "find/slice/int recursive parser", ops_per_s(dec(PyRespReader), rounds))
