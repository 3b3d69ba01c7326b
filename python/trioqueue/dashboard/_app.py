"""The dashboard's ASGI application: pages, actions and the live event stream."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
import trio

from .._core import decode_envelope
from .._model._errors import TrioQueueError, ValidationError
from .._model._flows import JobRef, split_links
from .._model._types import JobState
from ._http import HTTPError, Receive, Request, Response, Scope, Send, local_path, redirect
from ._hub import Hub
from ..storage._capabilities import Administration, Groups
from ._security import AUTH_COOKIE, SESSION_COOKIE, Security

__all__ = ["DashboardApp"]

logger = logging.getLogger("trioqueue.dashboard")

STATES = [s.value for s in (
    JobState.QUEUED,
    JobState.DELAYED,
    JobState.PROCESSING,
    JobState.FAILING,
    JobState.FAILED,
    JobState.COMPLETED,
    JobState.CANCELLED,
    JobState.WAITING_SIGNAL,
)]
ACTIONS = ("retry", "cancel", "remove", "purge", "clear", "pause", "resume", "pause_group", "resume_group")
PAGE_SIZES = (20, 50, 100)
KEEPALIVE = 15.0
_STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
NOTICES = {
    "retry-ok": "Retried: the job is queued again.",
    "retry-no": "Not retried: only a failed or cancelled job can be retried.",
    "cancel-ok": "Cancel: {status}.",
    "remove-ok": "Removed the job.",
    "remove-no": "Nothing removed: the job was not found.",
    "purge-ok": "Purged {n} job(s).",
    "clear-ok": "Cleared the queue: {n} job(s) forgotten.",
    "pause-ok": "Paused: workers claim no new jobs.",
    "pause-no": "The queue was already paused.",
    "resume-ok": "Resumed.",
    "resume-no": "The queue was not paused.",
    "pause-group-ok": "Group paused: its jobs are not claimed until it is resumed.",
    "pause-group-no": "The group was already paused.",
    "resume-group-ok": "Group resumed.",
    "resume-group-no": "The group was not paused.",
}


def _when(ts: float | None) -> str:
    if not ts:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(ts: float | None) -> str:
    if not ts:
        return ""
    delta = time.time() - ts
    future = delta < 0
    delta = abs(delta)
    if delta < 60:
        text = f"{delta:.0f}s"
    elif delta < 3600:
        text = f"{delta / 60:.0f}m"
    elif delta < 86400:
        text = f"{delta / 3600:.1f}h"
    else:
        text = f"{delta / 86400:.1f}d"
    return f"in {text}" if future else f"{text} ago"


def _show(value: Any, indent: int | None = 2) -> str:
    """A value as readable text: JSON (indented) when it is JSON, else its repr."""
    if isinstance(value, bytes | bytearray):
        try:
            value = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            return repr(bytes(value))
    try:
        return json.dumps(value, indent=indent, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


class DashboardApp:
    """The ASGI callable. ``hub`` must be running (``await nursery.start(hub.run)``)."""

    def __init__(
        self, hub: Hub, *, auth_token: str | None = None, read_only: bool = False, heartbeat_ttl: float = 30.0
    ) -> None:
        self.hub = hub
        self.heartbeat_ttl = heartbeat_ttl
        self.read_only = read_only
        self.security = Security(auth_token)
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("trioqueue.dashboard", "templates"),
            autoescape=True,  # every value rendered is escaped: payloads show as text
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters.update(when=_when, ago=_ago, show=_show)
        self.templates.globals.update(states=STATES)
        self._static = resources.files("trioqueue.dashboard") / "static"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return  # no websockets
        request = Request(scope, receive)
        session = self.security.session(request)
        new_session = None
        if session is None:
            session = new_session = self.security.new_session()
        try:
            response = await self._dispatch(request, session, send)
        except HTTPError as exc:
            response = self._error(request, session, exc.status, exc.message)
        except ValidationError as exc:
            response = self._error(request, session, 400, str(exc))
        except NotImplementedError as exc:
            response = self._error(request, session, 501, f"not supported by this storage: {exc}")
        except TrioQueueError as exc:  # the storage is unreachable, a job cannot be decoded...
            logger.warning("dashboard: %s %s failed: %s", request.method, request.path, exc)
            response = self._error(request, session, 503, str(exc))
        if response is None:
            return  # streamed
        if new_session is not None:
            response.set_cookie(SESSION_COOKIE, new_session)
        await response.send(send)

    # -- routing ---------------------------------------------------------------------------

    async def _dispatch(self, request: Request, session: str, send: Send) -> Response | None:
        self.security.check_host(request)
        path, method = request.path, request.method
        if path.startswith("/static/") and method == "GET":
            return self._static_file(path[len("/static/") :])
        if path == "/login":
            return await self._login(request, session)
        if not self.security.authenticated(request):
            if method == "GET" and path != "/events":
                return redirect("/login?next=" + _quote(request.full_path))
            raise HTTPError(401, "authentication required (the --auth-token, as 'Authorization: Bearer TOKEN')")
        if method == "POST":
            form = await request.form()
            self.security.check_post(request, form)
            if path == "/logout":
                response = redirect("/login")
                response.set_cookie(AUTH_COOKIE, "", max_age=0)
                return response
            if path == "/action":
                return await self._action(request, form)
            raise HTTPError(404, "no such page")
        if method not in ("GET", "HEAD") or path in ("/action", "/logout"):
            raise HTTPError(405, "method not allowed (actions are POST forms)")
        pages = {
            "/": self._overview,
            "/queue": self._job_list,
            "/job": self._job_detail,
            "/workers": self._workers,
            "/schedules": self._schedules,
        }
        if path == "/events":
            await self._events(request, send)
            return None
        if path in pages:
            return await pages[path](request, session)
        raise HTTPError(404, "no such page")

    def _render(self, request: Request, session: str, template: str, *, status: int = 200, **ctx: Any) -> Response:
        notice = NOTICES.get(request.query.get("notice", ""), "")
        if notice:
            notice = notice.format(n=request.query.get("n", "?")[:12], status=request.query.get("status", "")[:20])
        html = self.templates.get_template(template).render(
            csrf=self.security.csrf_token(session),
            read_only=self.read_only,
            auth=self.security.auth_token is not None,
            queue_names=sorted(self.hub.queues),
            notice=notice,
            path=_without_notice(request),
            now=time.time(),
            **ctx,
        )
        return Response(html, status=status)

    def _error(self, request: Request, session: str, status: int, message: str) -> Response:
        if request.path == "/events" or "text/html" not in request.headers.get("accept", ""):
            return Response.text(message, status=status)
        return self._render(request, session, "error.html", status=status, status_code=status, message=message)

    def _static_file(self, name: str) -> Response:
        suffix = "." + name.rpartition(".")[2]
        if "/" in name or name.startswith(".") or suffix not in _STATIC_TYPES:
            raise HTTPError(404, "no such file")
        item = self._static / name
        if not item.is_file():
            raise HTTPError(404, "no such file")
        return Response(item.read_bytes(), content_type=_STATIC_TYPES[suffix])

    async def _queue(self, request: Request, field: str = "queue") -> Any:
        name = request.query.get(field, "")
        if name not in self.hub.queues and self.hub.fixed_names is None:
            await self.hub.discover()
        if name not in self.hub.queues:
            raise HTTPError(404, f"no queue named {name!r}")
        return self.hub.queues[name]

    # -- pages -----------------------------------------------------------------------------

    async def _overview(self, request: Request, session: str) -> Response:
        rows = []
        for name in sorted(self.hub.queues):
            workers = await self.hub.storage.workers(name)
            rows.append(
                {
                    "name": name,
                    "counts": self.hub.counts.get(name, {}),
                    "paused": self.hub.paused.get(name, False),
                    "workers": len(workers),
                }
            )
        return self._render(request, session, "overview.html", rows=rows)

    async def _job_list(self, request: Request, session: str) -> Response:
        queue = await self._queue(request, "name")
        state = request.query.get("state", "failed")
        if state not in STATES:
            raise HTTPError(400, f"unknown state {state!r}; expected one of {', '.join(STATES)}")
        try:
            limit = int(request.query.get("limit", "20"))
        except ValueError:
            limit = 20
        limit = limit if limit in PAGE_SIZES else 20
        cursor = request.query.get("cursor") or None
        page = await queue.list_jobs(state, limit=limit, cursor=cursor)
        return self._render(
            request,
            session,
            "jobs.html",
            queue=queue.name,
            state=state,
            jobs=page.jobs,
            next_cursor=page.cursor,
            cursor=cursor,
            limit=limit,
            page_sizes=PAGE_SIZES,
            counts=self.hub.counts.get(queue.name, {}),
            paused=self.hub.paused.get(queue.name, False),
            groups=await _groups(queue),
        )

    async def _job_detail(self, request: Request, session: str) -> Response:
        queue = await self._queue(request)
        job_id = request.query.get("id", "").strip()
        if not job_id:
            raise HTTPError(400, "give a job id")
        status = await queue.get_status(job_id)
        if status is None:
            return self._render(
                request, session, "job.html", status=404, queue=queue.name, job_id=job_id, job=None, has_payload=False
            )
        has_payload, payload = await self._payload(queue, job_id)
        children, dependencies = split_links(JobRef(queue.name, job_id), await queue.children(job_id))
        return self._render(
            request,
            session,
            "job.html",
            queue=queue.name,
            job_id=job_id,
            job=status,
            has_payload=has_payload,
            payload=payload,
            children=children,
            dependencies=dependencies,
        )

    async def _payload(self, queue: Any, job_id: str) -> tuple[bool, Any]:
        """``(shown, payload)``: decoded by the queue's payload serde (JSON by default;
        raw bytes when that fails); not shown when the storage cannot give it."""
        if not isinstance(queue.storage, Administration):
            return False, None
        envelope = await queue.storage.get_envelope(queue.name, job_id)
        if envelope is None:
            return False, None
        try:
            data = decode_envelope(envelope)[1]
        except Exception:  # noqa: BLE001 - a corrupt envelope is shown raw
            return True, envelope
        try:
            return True, queue.payload_serde.loads(data)
        except Exception:  # noqa: BLE001 - another serde: show the bytes
            return True, data

    async def _workers(self, request: Request, session: str) -> Response:
        now = time.time()
        rows = []
        for name in sorted(self.hub.queues):
            workers = await self.hub.storage.workers(name, include_expired=True)
            for worker_id, expiry in sorted(workers.items()):
                held = await self.hub.storage.held_jobs(name, worker_id)
                rows.append(
                    {
                        "queue": name,
                        "id": worker_id,
                        "expires_in": expiry - now,
                        "age": max(0.0, self.heartbeat_ttl - (expiry - now)),
                        "alive": expiry > now,
                        "held": len(held),
                    }
                )
        return self._render(request, session, "workers.html", rows=rows, heartbeat_ttl=self.heartbeat_ttl)

    async def _schedules(self, request: Request, session: str) -> Response:
        now = time.time()
        rows = []
        unsupported = False
        for name in sorted(self.hub.queues):
            queue = self.hub.queues[name]
            try:
                schedules = await queue.schedules()
            except NotImplementedError:
                unsupported = True
                continue
            for s in schedules:
                try:
                    payload: Any = queue.payload_serde.loads(s.payload)
                except Exception:  # noqa: BLE001 - shown raw
                    payload = s.payload
                try:
                    upcoming: float | None = s.next_tick(max(now, s.last_tick or 0.0))
                except Exception:  # noqa: BLE001 - a bad cron spec shows without its next tick
                    upcoming = None
                rows.append({"queue": name, "s": s, "payload": payload, "next": upcoming})
        return self._render(request, session, "schedules.html", rows=rows, unsupported=unsupported)

    async def _login(self, request: Request, session: str) -> Response:
        next_path = local_path(request.query.get("next"))
        if self.security.auth_token is None:
            return redirect(next_path)
        error = ""
        if request.method == "POST":
            form = await request.form()
            self.security.check_post(request, form)
            if self.security.token_matches(form.get("token", "")):
                response = redirect(local_path(form.get("next")))
                assert self.security.auth_cookie is not None
                response.set_cookie(AUTH_COOKIE, self.security.auth_cookie)
                return response
            error = "Wrong token."
        return self._render(request, session, "login.html", status=401 if error else 200, error=error, next=next_path)

    # -- actions ---------------------------------------------------------------------------

    async def _action(self, request: Request, form: dict[str, str]) -> Response:
        if self.read_only:
            raise HTTPError(403, "this dashboard is read-only")
        action = form.get("action", "")
        if action not in ACTIONS:
            raise HTTPError(400, f"unknown action {action!r}")
        name = form.get("queue", "")
        if name not in self.hub.queues:
            raise HTTPError(404, f"no queue named {name!r}")
        queue = self.hub.queues[name]
        back = local_path(form.get("next"), "/")
        extra = ""
        if action in ("retry", "cancel", "remove"):
            job_id = form.get("id", "")
            if not job_id:
                raise HTTPError(400, f"{action}: give a job id")
            if action == "retry":
                code = "retry-ok" if await queue.retry(job_id) else "retry-no"
            elif action == "cancel":
                result = await queue.cancel(job_id)
                code, extra = "cancel-ok", "&status=" + _quote(str(result.status))
            else:
                code = "remove-ok" if await queue.remove(job_id) else "remove-no"
        elif action == "purge":
            state = form.get("state", "")
            if state not in STATES:
                raise HTTPError(400, f"purge: unknown state {state!r}")
            older = form.get("older_than", "").strip()
            try:
                older_than = float(older) if older else None
            except ValueError:
                raise HTTPError(400, f"purge: older_than must be seconds, got {older!r}") from None
            purged = await queue.purge(state, older_than=older_than)
            code, extra = "purge-ok", f"&n={purged}"
        elif action == "clear":
            if form.get("confirm") != name:  # the form names the queue it clears
                raise HTTPError(400, f"clear: confirm with the queue's name ({name!r}); nothing was cleared")
            cleared = await queue.clear()
            code, extra = "clear-ok", f"&n={cleared}"
        elif action in ("pause_group", "resume_group"):
            group = form.get("group", "")
            try:
                done = await (queue.pause_group(group) if action == "pause_group" else queue.resume_group(group))
            except ValidationError as exc:
                raise HTTPError(400, f"{action}: {exc}") from None
            code = action.replace("_", "-") + ("-ok" if done else "-no")
        elif action == "pause":
            code = "pause-ok" if await queue.pause() else "pause-no"
        else:
            code = "resume-ok" if await queue.resume() else "resume-no"
        logger.info("dashboard: %s on queue %r (%s) -> %s", action, name, form.get("id") or form.get("state", ""), code)
        self.hub.touch(name)
        sep = "&" if "?" in back else "?"
        return redirect(f"{back}{sep}notice={code}{extra}")

    # -- live updates ----------------------------------------------------------------------

    async def _events(self, request: Request, send: Send) -> None:
        """Server-sent events: ``hello`` (a snapshot), then ``counts`` and ``jobs`` (a batch
        of job events) messages from the hub's one subscription per queue; ``resync`` if
        this browser fell behind."""
        wanted = request.query.get("queue")  # one queue's pages; all queues without it
        queues = frozenset([wanted]) if wanted else None
        headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def message(name: str, data: Any) -> None:
            body = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            await send({"type": "http.response.body", "body": body, "more_body": True})

        async with self.hub.subscribe(queues) as sub, trio.open_nursery() as nursery:

            async def until_disconnect() -> None:
                while (await request.receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_disconnect)
            await message("hello", self.hub.snapshot(queues))
            while True:
                item = None
                with trio.move_on_after(KEEPALIVE) as idle:
                    item = await sub.get()
                if idle.cancelled_caught:
                    await send({"type": "http.response.body", "body": b": keepalive\n\n", "more_body": True})
                    continue
                if item is None:
                    break  # the dashboard is shutting down
                await message(*item)
            nursery.cancel_scope.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _quote(text: str) -> str:
    return quote(text, safe="/")


async def _groups(queue: Any) -> list[tuple[str, int, int, bool]]:
    """The queue page's groups: ``(group, queued, processing, paused)``, by name (none
    where the storage has no groups). For a page load: it may scan the active jobs."""
    if not isinstance(queue.storage, Groups):
        return []
    counts = await queue.group_counts()
    paused = set(await queue.paused_groups())
    names = sorted((set(counts) - {""}) | paused)
    return [(g, counts.get(g, {}).get("queued", 0), counts.get(g, {}).get("processing", 0), g in paused) for g in names]


def _without_notice(request: Request) -> str:
    """The request's path and query, less the notice of a previous action."""
    query = {k: v for k, v in request.query.items() if k not in ("notice", "n", "status")}
    return request.path + ("?" + urlencode(query) if query else "")
