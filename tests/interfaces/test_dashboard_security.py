"""The dashboard's HTTP surface against the real server (Hypercorn on Trio): who may bind
where, token authentication (header and login cookie), CSRF on actions, read-only mode,
escaping, and the live event stream (one subscription per process for every browser)."""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from trioqueue import FileStorage, Job, JobFailedError, JobState, MemoryStorage, Queue, ValidationError
from trioqueue.dashboard import Dashboard

from dashboard_client import Client, EventReader, Reply
from redis_server import free_port
from support import ProcessLines

T = TypeVar("T")
TOKEN = "s3cret-token"


async def in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


class _CodedError(Exception):
    def to_dict(self) -> dict[str, Any]:
        return {"code": self.args[0]}


async def _handler(job: Job[Any]) -> Any:
    if isinstance(job.payload, dict) and job.payload.get("fail"):
        raise RuntimeError(job.payload["fail"])
    if isinstance(job.payload, dict) and job.payload.get("code"):
        raise _CodedError(job.payload["code"])
    return job.payload


class Served:
    def __init__(self, queue: Queue[Any, Any], dashboard: Dashboard, base: str) -> None:
        self.queue = queue
        self.dashboard = dashboard
        self.base = base

    def client(self) -> Client:
        return Client(self.base)


async def _serve(**options: Any) -> AsyncIterator[Served]:
    storage = MemoryStorage()
    async with Queue(storage, name="jobs", handler=_handler, max_attempts=1) as queue, trio.open_nursery() as nursery:
        dashboard = Dashboard(storage, port=0, names=["jobs"], **options)
        [base] = await nursery.start(dashboard.run)
        yield Served(queue, dashboard, base)
        nursery.cancel_scope.cancel()


@pytest.fixture
async def open_dash() -> AsyncIterator[Served]:
    async for served in _serve():
        yield served


@pytest.fixture
async def token_dash() -> AsyncIterator[Served]:
    async for served in _serve(auth_token=TOKEN):
        yield served


@pytest.fixture
async def ro_dash() -> AsyncIterator[Served]:
    async for served in _serve(read_only=True):
        yield served


def _action(client: Client, csrf: str | None, **fields: str) -> Reply:
    form = {"queue": "jobs", "next": "/", **fields}
    if csrf is not None:
        form["csrf"] = csrf
    return client.post("/action", form)


# -- binding ---------------------------------------------------------------------------


def test_refuses_non_loopback_bind_without_token() -> None:
    with pytest.raises(ValidationError, match="without --auth-token"):
        Dashboard(MemoryStorage(), host="0.0.0.0")
    Dashboard(MemoryStorage(), host="0.0.0.0", auth_token=TOKEN)  # allowed with a token
    Dashboard(MemoryStorage(), host="::1")  # loopback
    with pytest.raises(ValidationError, match="must not be empty"):
        Dashboard(MemoryStorage(), host="0.0.0.0", auth_token=" ")


def test_cli_refuses_non_loopback_bind_without_token(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trioqueue", "dashboard", "--storage", "memory://", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "TRIOQUEUE_DASHBOARD_TOKEN"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "refusing to serve the dashboard on '0.0.0.0' without --auth-token" in proc.stderr


async def test_cli_serves_and_stops_on_sigint(tmp_path: Path) -> None:
    store = tmp_path / "store"
    async with Queue(FileStorage(store), name="jobs") as producer:
        await producer.enqueue("j1", {"n": 1})
    port = free_port()
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "trioqueue", "dashboard", "--storage", f"file://{store}", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines = ProcessLines(proc)
    try:
        with trio.fail_after(60):
            line = await lines.wait_for("")
            while "dashboard serving" not in line:
                line = await lines.readline()
            assert f"http://127.0.0.1:{port}" in line
            reply = await in_thread(lambda: Client(f"http://127.0.0.1:{port}").get("/"))
            assert reply.status == 200
            assert 'data-queue="jobs" data-state="queued">1<' in reply.body  # discovered, counted
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_no_asyncio_in_the_process() -> None:
    """Hypercorn runs on Trio: serving a page never loads asyncio."""
    script = (
        "import sys, trio, urllib.request\n"
        "from trioqueue import MemoryStorage\n"
        "from trioqueue.dashboard import Dashboard\n"
        "async def main():\n"
        "    d = Dashboard(MemoryStorage(), port=0)\n"
        "    async with trio.open_nursery() as n:\n"
        "        [url] = await n.start(d.run)\n"
        "        await trio.to_thread.run_sync(lambda: urllib.request.urlopen(url + '/events').readline())\n"
        "        await trio.to_thread.run_sync(lambda: urllib.request.urlopen(url + '/').read())\n"
        "        d.stop()\n"
        "    print('asyncio' in sys.modules)\n"
        "trio.run(main)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# -- no token: loopback only, CSRF on actions -------------------------------------------


async def test_pages_render_and_security_headers(open_dash: Served) -> None:
    client = open_dash.client()
    for path in ("/", "/queue?name=jobs&state=failed", "/job?queue=jobs&id=nope", "/workers", "/schedules"):
        reply = await in_thread(lambda: client.get(path))
        assert reply.status in (200, 404), (path, reply.status)
        assert "script-src 'self'" in reply.headers["content-security-policy"]
        assert reply.headers["x-frame-options"] == "DENY"
    reply = await in_thread(lambda: client.get("/queue?name=nope&state=failed"))
    assert reply.status == 404 and "no queue named" in reply.body


async def test_foreign_host_header_refused_without_token(open_dash: Served) -> None:
    client = open_dash.client()
    reply = await in_thread(lambda: client.get("/", headers={"Host": "evil.example:8181"}))
    assert reply.status == 421
    reply = await in_thread(lambda: client.get("/", headers={"Host": "localhost:8181"}))
    assert reply.status == 200


async def test_actions_need_a_valid_csrf_token(open_dash: Served) -> None:
    client = open_dash.client()
    page = await in_thread(lambda: client.get("/"))
    csrf = page.csrf()
    assert "tq_session" in client.cookies
    for bad in (None, "", "0" * 64):
        reply = await in_thread(lambda: _action(client, bad, action="pause"))
        assert reply.status == 403 and "CSRF" in reply.body
    assert not await open_dash.queue.is_paused()
    # a token is bound to its session: another browser's token is refused
    other = open_dash.client()
    other_csrf = (await in_thread(lambda: other.get("/"))).csrf()
    reply = await in_thread(lambda: _action(client, other_csrf, action="pause"))
    assert reply.status == 403
    # a cross-site request is refused even with the right token
    reply = await in_thread(
        lambda: client.post("/action", {"queue": "jobs", "action": "pause", "csrf": csrf}, headers={"Origin": "http://evil.example"})
    )
    assert reply.status == 403 and "cross-origin" in reply.body
    reply = await in_thread(lambda: _action(client, csrf, action="pause"))
    assert reply.status == 303 and reply.headers["location"] == "/?notice=pause-ok"
    assert await open_dash.queue.is_paused()
    # a GET never acts
    reply = await in_thread(lambda: client.get(f"/action?queue=jobs&action=resume&csrf={csrf}"))
    assert reply.status == 405
    assert await open_dash.queue.is_paused()


async def test_action_redirects_stay_on_the_site(open_dash: Served) -> None:
    client = open_dash.client()
    csrf = (await in_thread(lambda: client.get("/"))).csrf()
    reply = await in_thread(lambda: _action(client, csrf, action="pause", next="//evil.example/x"))
    assert reply.status == 303 and reply.headers["location"].startswith("/?")


# -- token ------------------------------------------------------------------------------


async def test_token_required_by_header_or_login(token_dash: Served) -> None:
    client = token_dash.client()
    reply = await in_thread(lambda: client.get("/workers"))
    assert reply.status == 303 and reply.headers["location"] == "/login?next=/workers"
    reply = await in_thread(lambda: client.get("/events"))
    assert reply.status == 401
    reply = await in_thread(lambda: client.get("/", headers={"Authorization": "Bearer wrong"}))
    assert reply.status == 303
    reply = await in_thread(lambda: client.get("/", headers={"Authorization": f"Bearer {TOKEN}"}))
    assert reply.status == 200
    # a foreign Host is fine once a token protects the dashboard
    reply = await in_thread(
        lambda: client.get("/", headers={"Authorization": f"Bearer {TOKEN}", "Host": "jobs.example.com"})
    )
    assert reply.status == 200

    login = await in_thread(lambda: client.get("/login?next=/workers"))
    csrf = login.csrf()
    reply = await in_thread(lambda: client.post("/login", {"token": "wrong", "csrf": csrf, "next": "/workers"}))
    assert reply.status == 401 and "Wrong token" in reply.body and "tq_auth" not in client.cookies
    reply = await in_thread(lambda: client.post("/login", {"token": TOKEN, "csrf": csrf, "next": "/workers"}))
    assert reply.status == 303 and reply.headers["location"] == "/workers"
    assert client.cookies["tq_auth"] and TOKEN not in client.cookies["tq_auth"]
    reply = await in_thread(lambda: client.get("/workers"))
    assert reply.status == 200

    # logged in by cookie: actions still need the CSRF token
    reply = await in_thread(lambda: _action(client, None, action="pause"))
    assert reply.status == 403
    reply = await in_thread(lambda: _action(client, reply_csrf(client), action="pause"))
    assert reply.status == 303 and await token_dash.queue.is_paused()

    # a script authenticated by the header needs no CSRF token (browsers never send it)
    script = token_dash.client()
    reply = await in_thread(
        lambda: script.post(
            "/action", {"queue": "jobs", "action": "resume"}, headers={"Authorization": f"Bearer {TOKEN}"}
        )
    )
    assert reply.status == 303 and not await token_dash.queue.is_paused()

    # logging out drops the cookie
    reply = await in_thread(lambda: client.post("/logout", {"csrf": reply_csrf(client)}))
    assert reply.status == 303 and "tq_auth" not in client.cookies
    assert (await in_thread(lambda: client.get("/"))).status == 303


def reply_csrf(client: Client) -> str:
    return client.get("/").csrf()


# -- read-only --------------------------------------------------------------------------


async def test_read_only_hides_and_refuses_actions(ro_dash: Served) -> None:
    with pytest.raises(JobFailedError):
        await ro_dash.queue.enqueue_and_wait("bad", {"fail": "no"}, timeout=30)
    client = ro_dash.client()
    for path in ("/", "/queue?name=jobs&state=failed", "/job?queue=jobs&id=bad"):
        reply = await in_thread(lambda: client.get(path))
        assert reply.status == 200
        assert "data-action=" not in reply.body and 'action="/action"' not in reply.body, path
        assert "read-only" in reply.body
    csrf = ro_dash.dashboard.app.security.csrf_token(client.cookies["tq_session"])  # a valid one
    reply = await in_thread(lambda: _action(client, csrf, action="retry", id="bad"))
    assert reply.status == 403 and "read-only" in reply.body
    assert (await ro_dash.queue.get_status("bad")).state == "failed"  # type: ignore[union-attr]


# -- escaping and the live stream -------------------------------------------------------


async def test_values_are_escaped(open_dash: Served) -> None:
    evil = "<script>alert('x')</script>"
    result = await open_dash.queue.enqueue_and_wait("xss", {"html": evil}, timeout=30)
    assert result == {"html": evil}
    reply = await in_thread(lambda: open_dash.client().get("/job?queue=jobs&id=xss"))
    assert reply.status == 200
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in reply.body
    assert "<script>alert" not in reply.body


async def test_job_page_shows_the_error_data_escaped(open_dash: Served) -> None:
    evil = "<b>E42</b>"
    with pytest.raises(JobFailedError) as failed:
        await open_dash.queue.enqueue_and_wait("coded", {"code": evil}, timeout=30)
    assert failed.value.data == {"code": evil}
    reply = await in_thread(lambda: open_dash.client().get("/job?queue=jobs&id=coded"))
    assert reply.status == 200 and 'id="job-error-data"' in reply.body
    assert "&lt;b&gt;E42&lt;/b&gt;" in reply.body and evil not in reply.body


async def test_event_stream_fans_out_one_subscription(open_dash: Served) -> None:
    base = open_dash.base
    readers = [await in_thread(lambda: EventReader(base, "/events?queue=jobs")) for _ in range(2)]
    try:
        for reader in readers:
            assert reader.status == 200
            name, data = await in_thread(reader.next)
            assert name == "hello" and "jobs" in json.loads(data)["counts"]
        # two browsers, one subscription to the queue's events in the dashboard
        hub_queue = open_dash.dashboard.hub.queues["jobs"]
        assert len(hub_queue._events.streams) == 1
        await open_dash.queue.enqueue_many([(f"live-{i}", {"n": i}) for i in range(40)])
        for reader in readers:
            seen: dict[str, Any] = {}
            completed: dict[str, None] = {}
            results: dict[str, str] = {}
            kinds: dict[str, int] = {}
            with trio.fail_after(30):
                while seen.get("completed", 0) < 40 or len(completed) < 40:
                    name, data = await in_thread(reader.next)
                    message = json.loads(data)
                    if name == "counts":
                        seen = message["counts"]
                    elif name == "jobs":  # batches: every event counted, every id named
                        assert message["queue"] == "jobs" and not message["more"]
                        for kind, n in message["kinds"].items():
                            kinds[kind] = kinds.get(kind, 0) + n
                        completed.update(dict.fromkeys(message["ids"]))
                        results.update(message["results"])
            assert kinds["enqueued"] == 40
            # the completed events carry their results: previewed as JSON
            assert results == {f"live-{i}": json.dumps({"n": i}) for i in range(40)}
            assert sorted(completed) == sorted(f"live-{i}" for i in range(40))
    finally:
        for reader in readers:
            reader.close()


# -- actions and paging through the server ----------------------------------------------


async def test_cancel_remove_purge_actions(open_dash: Served) -> None:
    queue = open_dash.queue
    client = open_dash.client()
    csrf = (await in_thread(lambda: client.get("/"))).csrf()
    await queue.pause()
    await queue.enqueue("waiting", {"n": 1})
    detail = "/job?queue=jobs&id=waiting"
    reply = await in_thread(lambda: _action(client, csrf, action="cancel", id="waiting", next=detail))
    assert reply.status == 303 and reply.headers["location"] == detail + "&notice=cancel-ok&status=cancelled"
    assert (await queue.get_status("waiting")).state == "cancelled"  # type: ignore[union-attr]
    page = await in_thread(lambda: client.get(reply.headers["location"]))
    assert "Cancel: cancelled." in page.body and 'data-action="retry"' in page.body
    reply = await in_thread(lambda: _action(client, csrf, action="remove", id="waiting"))
    assert reply.headers["location"] == "/?notice=remove-ok"
    assert await queue.get_status("waiting") is None
    assert (await in_thread(lambda: client.get(detail))).status == 404
    reply = await in_thread(lambda: _action(client, csrf, action="remove", id="waiting"))
    assert reply.headers["location"] == "/?notice=remove-no"

    await queue.resume()
    for i in range(3):
        with pytest.raises(JobFailedError):
            await queue.enqueue_and_wait(f"bad-{i}", {"fail": "x"}, timeout=30)
    reply = await in_thread(lambda: _action(client, csrf, action="purge", state="failed", older_than="3600"))
    assert reply.headers["location"] == "/?notice=purge-ok&n=0"  # none that old
    reply = await in_thread(lambda: _action(client, csrf, action="purge", state="failed"))
    assert reply.headers["location"] == "/?notice=purge-ok&n=3"
    assert (await queue.counts())[JobState.FAILED] == 0
    reply = await in_thread(lambda: _action(client, csrf, action="purge", state="queued"))
    assert reply.status == 400  # only terminal states are purged

    # clear: the form names the queue; every job goes
    await queue.pause()
    await queue.enqueue_many([("w1", {"n": 1}), ("w2", {"n": 2})])
    page = await in_thread(lambda: client.get("/queue?name=jobs&state=queued"))
    assert 'data-action="clear"' in page.body and 'name="confirm" value="jobs"' in page.body
    reply = await in_thread(lambda: _action(client, csrf, action="clear"))
    assert reply.status == 400 and "nothing was cleared" in reply.body
    assert (await queue.counts())[JobState.QUEUED] == 2
    reply = await in_thread(lambda: _action(client, csrf, action="clear", confirm="jobs"))
    assert reply.headers["location"] == "/?notice=clear-ok&n=2"
    assert set((await queue.counts()).values()) == {0}


async def test_job_list_pages_with_a_cursor(open_dash: Served) -> None:
    queue = open_dash.queue
    await queue.pause()
    await queue.enqueue_many([(f"job-{i:02d}", {"n": i}) for i in range(25)])
    client = open_dash.client()
    first = await in_thread(lambda: client.get("/queue?name=jobs&state=queued&limit=20"))
    ids = re.findall(r'data-job="(job-\d+)"', first.body)
    assert len(ids) == 20
    match = re.search(r'id="next-page" href="([^"]+)"', first.body)
    assert match
    second = await in_thread(lambda: client.get(html.unescape(match.group(1))))
    rest = re.findall(r'data-job="(job-\d+)"', second.body)
    assert len(rest) == 5 and not set(rest) & set(ids)
    assert sorted(ids + rest) == [f"job-{i:02d}" for i in range(25)]
    assert 'id="next-page"' not in second.body
