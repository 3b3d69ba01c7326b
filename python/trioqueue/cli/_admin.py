"""The admin commands of the ``trioqueue`` command line: ``stats``, ``list``, ``show``,
``cancel``, ``retry``, ``remove``, ``purge``, ``clear``, ``pause``, ``resume``, ``enqueue``, ``signal`` and
``migrate`` (PostgreSQL schema migrations, for teams that run them themselves).

Each opens the storage named by ``--storage`` (see :func:`~trioqueue.storage.from_url`)
and a producer-only :class:`~trioqueue.Queue` named ``--name`` (no handler, no reaper),
runs one call of the Queue API and prints a human table, or JSON with ``--json``. A
refusal (unknown job, job in the wrong state...) is a one-line error and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from typing import Any

from .._model._errors import JobFailedError, TrioQueueError, ValidationError
from .._model._flows import JobRef, split_links
from .._model._options import ENQUEUE_OPTIONS
from .._model._types import CancelStatus, JobState, JobStatus

__all__ = ["ADMIN_COMMANDS", "add_admin_commands", "admin_command"]

ADMIN_COMMANDS = (
    "stats", "list", "show", "cancel", "retry", "remove", "purge", "clear", "pause", "resume", "enqueue", "signal", "migrate",
)  # fmt: skip
_STATES = [s.value for s in JobState]
_TERMINAL = [s.value for s in JobState if s.terminal]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return value


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to 10000, got {text!r}")
    return value


def add_admin_commands(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """Add the admin subcommands to the ``trioqueue`` parser's subparsers ``sub``."""
    fmt = argparse.ArgumentDefaultsHelpFormatter

    def command(name: str, help: str, *, all_queues: bool = False) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help, formatter_class=fmt)
        from ._run import storage_url

        p.add_argument(
            "--storage", type=storage_url, required=True, metavar="URL", help="storage URL (redis://..., postgresql://..., file:///dir, a path)"
        )
        if all_queues:
            p.add_argument("--name", default=None, help="queue name (when not given: every queue the storage knows)")
        else:
            p.add_argument("--name", default="default", help="queue name")
        p.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of a table")
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print tracebacks of errors")
        return p

    p = command("stats", "number of jobs in each state, and whether the queue is paused", all_queues=True)
    p.add_argument("--group", action="store_true", help="also the queued and running jobs of each group, and paused groups")
    p = command("list", "jobs in one state, newest first, a page at a time")
    p.add_argument("state", choices=_STATES, help="state to list")
    p.add_argument("--limit", type=_limit, default=20, help="jobs per page")
    p.add_argument("--cursor", default=None, help="the cursor printed with the previous page")
    for name, what in (
        ("show", "a job's status, result or error (with traceback)"),
        ("cancel", "cancel a queued, delayed, failing or running job"),
        ("retry", "run a failed (or cancelled) job again, attempts reset, resuming after its last stored step"),
        ("remove", "forget a job that is not running"),
    ):
        p = command(name, what)
        p.add_argument("job_id", metavar="ID", help="job id")
        if name == "retry":
            p.add_argument("--reset-steps", action="store_true", help="forget the job's stored steps: it starts over")
    p = command("purge", "forget finished jobs of one state")
    p.add_argument("state", choices=_TERMINAL, help="terminal state to purge")
    p.add_argument("--older-than", type=_seconds, default=None, metavar="S", help="only jobs finished more than S seconds ago (default: all)")
    p = command("clear", "forget every job of the queue, in every state (running ones included); schedules are kept")
    p.add_argument("--yes", action="store_true", help="confirm: nothing is cleared without it")
    p.add_argument("--schedules", action="store_true", help="remove the queue's schedules too")
    command("pause", "stop every worker of the queue from claiming jobs")
    command("resume", "let the workers of the queue claim jobs again")
    p = command("enqueue", "enqueue a job (its payload is JSON)")
    p.add_argument("job_id", metavar="ID", help="job id")
    p.add_argument("--payload", required=True, metavar="JSON", help="the job's payload, as JSON")
    for option, about in ENQUEUE_OPTIONS.items():  # one flag per enqueue option
        flag = f"--{option.replace('_', '-')}"
        p.add_argument(flag, type=about.number, default=None, metavar=about.metavar, help=about.text)
    p.add_argument("--wait", action="store_true", help="wait for the job's result and print it")
    p.add_argument("--timeout", type=_seconds, default=30.0, metavar="S", help="how long --wait waits")
    p = command("signal", "send a message to a job, for its wait_for_signal (its payload is JSON)")
    p.add_argument("job_id", metavar="ID", help="job id")
    p.add_argument("signal", metavar="NAME", help="the signal's name")
    p.add_argument("--payload", default="null", metavar="JSON", help="the message's payload, as JSON (default: null)")
    p = command("migrate", "create or upgrade a PostgreSQL storage's schema (workers do it on start otherwise)")
    p.add_argument("--schema", default=None, help="PostgreSQL schema (default: the URL's ?schema=, else trioqueue)")


# -- rendering ---------------------------------------------------------------------------


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


def _age(ts: float, now: float) -> str:
    s = max(now - ts, 0.0)
    if s < 60:
        return f"{s:.1f}s ago"
    if s < 3600:
        return f"{s / 60:.1f}m ago"
    if s < 86400:
        return f"{s / 3600:.1f}h ago"
    return f"{s / 86400:.1f}d ago"


def _status_json(s: JobStatus) -> dict[str, Any]:
    return {
        "id": s.id,
        "state": s.state.value,
        "attempts": s.attempts,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "worker_id": s.worker_id,
        "run_at": s.run_at,
        "progress": s.progress,
        "result": s.result,
        "error": None
        if s.error is None
        else {"type": s.error.type, "message": s.error.message, "traceback": s.error.traceback, "data": s.error.data},
        "parent": None if s.parent is None else {"queue": s.parent.queue, "id": s.parent.id},
        "group": s.group,
        "steps": s.steps,
        "children": None if s.children is None else {k.value: n for k, n in s.children.items() if n},
    }


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _one_line(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=repr, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _emit(args: argparse.Namespace, data: Any, human: str) -> None:
    if args.json:
        print(json.dumps(data, default=repr, ensure_ascii=False))
    else:
        print(human)


# -- the commands ------------------------------------------------------------------------


async def admin_command(args: argparse.Namespace) -> int:
    from .._model import _validate as check
    from .._supervision._queue import Queue
    from ..storage import from_url
    from ..storage._capabilities import Administration, require

    if args.command == "migrate":
        return await _migrate(args)
    storage = from_url(args.storage)
    if args.command == "stats":
        async with storage:
            if args.name is not None:
                names = [check.job_id(args.name, "name")]
            else:
                names = await require(storage, Administration, "stats of every queue (give --name)").queue_names()
            code = await _stats(args, [Queue(storage, name=n, reaper=False) for n in names])
        return code
    queue: Queue[Any, Any] = Queue(storage, name=args.name, reaper=False)
    async with queue:
        code = await _COMMANDS[args.command](args, queue)
    return code


async def _migrate(args: argparse.Namespace) -> int:
    from ..storage import from_url

    options: dict[str, Any] = {"migrate": False}
    if args.schema is not None:
        options["schema"] = args.schema
    if not args.storage.lower().startswith(("postgresql://", "postgres://")):
        from_url(args.storage)  # a bad URL is reported as such
        _emit(args, {"applied": [], "version": None}, "this storage has no schema to migrate")
        return 0
    storage: Any = from_url(args.storage, **options)
    async with storage:
        applied = await storage.migrate()
        version = await storage.schema_version()
    human = f"schema {storage.schema!r}: " + (
        f"applied migration(s) {', '.join(map(str, applied))}, now at version {version}" if applied else f"up to date (version {version})"
    )
    _emit(args, {"schema": storage.schema, "applied": applied, "version": version}, human)
    return 0


async def _stats(args: argparse.Namespace, queues: list[Any]) -> int:
    data: dict[str, Any] = {}
    for queue in queues:
        async with queue:
            counts = await queue.counts()
            data[queue.name] = {"counts": {k.value: v for k, v in counts.items()}, "paused": await queue.is_paused()}
            if args.group:
                data[queue.name]["groups"] = await _group_stats(queue)
    rows = [["queue", *_STATES, "paused"]]
    rows += [[n, *(str(d["counts"][s]) for s in _STATES), "yes" if d["paused"] else "no"] for n, d in data.items()]
    human = _table(rows) if data else "no queues"
    for n, d in data.items() if args.group else ():
        grows = [["group", "queued", "processing", "paused"]]
        grows += [[g or "(no group)", str(c["queued"]), str(c["processing"]), "yes" if c["paused"] else "no"] for g, c in d["groups"].items()]
        human += f"\n\nqueue {n}: " + ("\n" + _table(grows) if len(grows) > 1 else "no groups")
    _emit(args, data, human)
    return 0


async def _group_stats(queue: Any) -> dict[str, dict[str, Any]]:
    """Per group (``""``: the jobs without one): its queued and processing jobs and
    whether it is paused, sorted by name."""
    counts = await queue.group_counts()
    paused = set(await queue.paused_groups())
    groups = sorted(set(counts) | paused)
    return {
        g: {"queued": counts.get(g, {}).get("queued", 0), "processing": counts.get(g, {}).get("processing", 0), "paused": g in paused}
        for g in groups
    }


async def _list(args: argparse.Namespace, queue: Any) -> int:
    page = await queue.list_jobs(args.state, limit=args.limit, cursor=args.cursor)
    now = time.time()
    rows = [["id", "attempts", "since", "detail"]]
    for s in page.jobs:
        if s.error is not None:
            detail = f"{s.error.type}: {s.error.message}"
        elif s.state is JobState.PROCESSING:
            detail = f"worker {s.worker_id}"
        elif s.state is JobState.DELAYED and s.run_at is not None:
            detail = f"due {_iso(s.run_at)}"
        elif s.state is JobState.COMPLETED:
            detail = _one_line(s.result)
        else:
            detail = ""
        rows.append([s.id, str(s.attempts), _age(s.updated_at, now), _one_line(detail)])
    human = _table(rows) if page.jobs else f"no {args.state} jobs"
    if page.cursor is not None:
        human += f"\nmore: --cursor {page.cursor}"
    _emit(args, {"jobs": [_status_json(s) for s in page.jobs], "cursor": page.cursor}, human)
    return 0


async def _show(args: argparse.Namespace, queue: Any) -> int:
    s = await queue.get_status(args.job_id)
    if s is None:
        raise TrioQueueError(f"job {args.job_id!r} not found in queue {queue.name!r}")
    lines = [
        f"id:         {s.id}",
        f"state:      {s.state.value}",
        f"attempts:   {s.attempts}",
        f"created:    {_iso(s.created_at)}",
        f"updated:    {_iso(s.updated_at)}",
    ]
    if s.worker_id is not None:
        lines.append(f"worker:     {s.worker_id}")
    if s.run_at is not None:
        lines.append(f"due:        {_iso(s.run_at)}")
    if s.progress is not None:
        lines.append(f"progress:   {_one_line(s.progress, 200)}")
    if s.parent is not None:
        lines.append(f"parent:     {s.parent.id} (queue {s.parent.queue})")
    if s.group is not None:
        lines.append(f"group:      {s.group}")
    if s.steps:
        lines.append(f"steps:      {len(s.steps)}")
        lines.extend(f"  {name}: {_one_line(json.dumps(value, default=repr, ensure_ascii=False), 200)}" for name, value in s.steps.items())
    data = _status_json(s)
    kids, deps = split_links(JobRef(queue.name, s.id), await queue.children(s.id))
    if s.children is not None:
        data["children"] = [{"queue": r.queue, "id": r.id, "state": c.state.value} for r, c in kids.items()]
        counts = ", ".join(f"{n} {k.value}" for k, n in s.children.items() if n)
        lines.append(f"children:   {counts or 'none'}")
        lines.extend(f"  {r.id} ({r.queue}): {c.state.value}" for r, c in kids.items())
    data["depends_on"] = [{"queue": r.queue, "id": r.id, "state": c.state.value} for r, c in deps.items()] or None
    if deps:
        by_state = Counter(c.state.value for c in deps.values())
        lines.append("depends on: " + ", ".join(f"{n} {state}" for state, n in by_state.items()))
        lines.extend(f"  {r.id} ({r.queue}): {c.state.value}" for r, c in deps.items())
    if s.state is JobState.COMPLETED:
        lines.append(f"result:     {json.dumps(s.result, default=repr, ensure_ascii=False)}")
    if s.error is not None:
        lines.append(f"error:      {s.error.type}: {s.error.message}")
        if s.error.data is not None:
            lines.append(f"error data: {json.dumps(s.error.data, ensure_ascii=False)}")
        if s.error.traceback:
            lines.append(s.error.traceback.rstrip())
    _emit(args, data, "\n".join(lines))
    return 0


async def _cancel(args: argparse.Namespace, queue: Any) -> int:
    out = await queue.cancel(args.job_id)
    if out.status is not CancelStatus.CANCELLED:
        what = "not found" if out.status is CancelStatus.NOT_FOUND else f"already {out.status.value}"
        raise TrioQueueError(f"job {args.job_id!r} not cancelled: {what}")
    _emit(args, {"id": out.id, "status": out.status.value}, f"job {out.id!r} cancelled")
    return 0


async def _refused(queue: Any, job_id: str, action: str, wanted: str) -> TrioQueueError:
    s = await queue.get_status(job_id)
    what = "it is unknown" if s is None else f"it is {s.state.value}"
    return TrioQueueError(f"job {job_id!r} not {action}: {what} ({wanted})")


async def _retry(args: argparse.Namespace, queue: Any) -> int:
    if not await queue.retry(args.job_id, reset_steps=args.reset_steps):
        raise await _refused(queue, args.job_id, "retried", "only failed or cancelled jobs are")
    again = "enqueued again, its steps reset" if args.reset_steps else "enqueued again"
    _emit(args, {"id": args.job_id, "retried": True, "reset_steps": args.reset_steps}, f"job {args.job_id!r} {again}")
    return 0


async def _remove(args: argparse.Namespace, queue: Any) -> int:
    if not await queue.remove(args.job_id):
        raise await _refused(queue, args.job_id, "removed", "a running job cannot be")
    _emit(args, {"id": args.job_id, "removed": True}, f"job {args.job_id!r} removed")
    return 0


async def _purge(args: argparse.Namespace, queue: Any) -> int:
    n = await queue.purge(args.state, older_than=args.older_than)
    _emit(args, {"state": args.state, "purged": n}, f"purged {n} {args.state} job{'s' if n != 1 else ''}")
    return 0


async def _clear(args: argparse.Namespace, queue: Any) -> int:
    if not args.yes:
        raise ValidationError(
            f"clear forgets every job of queue {queue.name!r} (running ones included): pass --yes to confirm;"
            " nothing was cleared"
        )
    n = await queue.clear(schedules=args.schedules)
    human = f"queue {queue.name!r} cleared: {n} job{'s' if n != 1 else ''} forgotten" + (
        ", schedules removed" if args.schedules else ""
    )
    _emit(args, {"queue": queue.name, "cleared": n, "schedules_removed": args.schedules}, human)
    return 0


async def _pause(args: argparse.Namespace, queue: Any) -> int:
    pause = args.command == "pause"
    changed = await (queue.pause() if pause else queue.resume())
    word = "paused" if pause else "resumed"
    human = f"queue {queue.name!r} {word}" if changed else f"queue {queue.name!r} was already {'paused' if pause else 'running'}"
    _emit(args, {"queue": queue.name, "paused": pause, "changed": changed}, human)
    return 0


async def _signal(args: argparse.Namespace, queue: Any) -> int:
    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        raise ValidationError(f"--payload is not valid JSON: {exc}") from None
    if await queue.signal(args.job_id, args.signal, payload) != "delivered":
        raise await _refused(queue, args.job_id, "signalled", "only a job that has not ended is")
    _emit(args, {"id": args.job_id, "signal": args.signal, "status": "delivered"}, f"signal {args.signal!r} delivered to job {args.job_id!r}")
    return 0


async def _enqueue(args: argparse.Namespace, queue: Any) -> int:
    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        raise ValidationError(f"--payload is not valid JSON: {exc}") from None
    options = {o: getattr(args, o) for o in ENQUEUE_OPTIONS if getattr(args, o) is not None}
    if args.wait:
        try:
            result = await queue.enqueue_and_wait(args.job_id, payload, timeout=args.timeout, **options)
        except JobFailedError as exc:
            if args.debug and exc.error.traceback:
                print(exc.error.traceback.rstrip(), file=sys.stderr)
            raise
        _emit(args, {"id": args.job_id, "result": result}, json.dumps(result, default=repr, ensure_ascii=False))
        return 0
    out = await queue.enqueue(args.job_id, payload, **options)
    data: dict[str, Any] = {"id": out.id, "status": out.status.value}
    human = f"job {out.id!r} {out.status.value}"
    if out.existing_state is not None:
        data["existing_state"] = out.existing_state.value
        human += f" (already {out.existing_state.value})"
    _emit(args, data, human)
    return 0


_COMMANDS = {
    "list": _list,
    "show": _show,
    "cancel": _cancel,
    "retry": _retry,
    "remove": _remove,
    "purge": _purge,
    "clear": _clear,
    "pause": _pause,
    "resume": _pause,
    "enqueue": _enqueue,
    "signal": _signal,
}
