"""``trioqueue worker --processes N``: a supervisor of N worker processes.

Each worker process runs what ``trioqueue worker`` runs with the same arguments (one
process), in a process group of its own: a Ctrl-C on the terminal reaches the supervisor
alone, which forwards it. The first SIGINT/SIGTERM is forwarded to every worker as a
graceful stop, the second as a forced one, and workers still alive :data:`KILL_AFTER`
seconds later are killed; a third signal kills them at once. The supervisor exits when all
have stopped: 0 after a graceful stop, 130 after a forced one.

A worker that exits by itself (a crash, ``kill -9``) is started again after a backoff
(:data:`INITIAL_BACKOFF` seconds doubling up to :data:`MAX_BACKOFF`, back to the start once
a worker ran :data:`RESET_AFTER` seconds); each restart is logged with the exit status. A
worker that exits before it serves its queues :data:`START_ATTEMPTS` times in a row means
a broken application or an unreachable storage: the supervisor stops the others and exits 1.
Worker 0 starts first, the others once it serves: if it exits before serving, the
supervisor gives up at once (its error, printed by the worker, is printed once).

Each worker's stdin is one end of a socket pair whose other end only the supervisor holds
(:class:`ParentLink`, the worker's side). The worker writes a line on it once it serves
(the supervisor notices it, and reads it when the worker exits: did it ever start?). The supervisor writes
a line per forwarded signal (``stop SIGTERM``, ``force SIGINT``): two signals sent at once
to a process can arrive as one, lines cannot. And the worker notices the supervisor's death
by the end of the socket (EOF), which the kernel delivers however the supervisor ended,
``kill -9`` included: it then forces its stop, so no worker outlives its supervisor.
``prctl(PR_SET_PDEATHSIG)`` was the other way, but it is Linux only and fires when the
parent *thread* that started the child exits, and Trio starts processes from its worker
threads, which exit when idle.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from collections.abc import AsyncIterator, Sequence

import trio

from .._model._errors import TrioQueueError
from ._run import EXIT_INTERRUPTED, EXIT_OK

__all__ = [
    "INITIAL_BACKOFF",
    "KILL_AFTER",
    "MAX_BACKOFF",
    "RESET_AFTER",
    "START_ATTEMPTS",
    "ParentLink",
    "supervise",
    "worker_commands",
]

logger = logging.getLogger("trioqueue.supervisor")

INITIAL_BACKOFF = 0.5  # seconds before the first restart of a worker that exited
MAX_BACKOFF = 30.0  # the longest wait before a restart
RESET_AFTER = 30.0  # a worker that ran this long before it exited restarts after INITIAL_BACKOFF
START_ATTEMPTS = 3  # exits before serving, in a row, after which the supervisor gives up
KILL_AFTER = 10.0  # seconds after a forced stop before the workers still alive are killed
READY = b"ready\n"

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def worker_commands(args: argparse.Namespace) -> list[list[str]]:
    """The command line of each worker process of ``trioqueue worker`` ``args``: the same
    options, one process each; worker ``i`` serves metrics on ``--metrics-port`` + ``i``
    (each on a free port of its own for 0)."""
    base = [sys.executable, "-m", "trioqueue", "worker", *args.queues, "--supervised"]
    base += ["--log-level", args.log_level, "--log-format", args.log_format]
    if args.storage is not None:
        base += ["--storage", args.storage]
    if args.concurrency is not None:
        base += ["--concurrency", str(args.concurrency)]
    if args.name is not None:
        base += ["--name", args.name]
    if args.debug:
        base.append("--debug")
    commands = []
    for index in range(args.processes):
        command = list(base)
        if args.metrics_port is not None:
            port = args.metrics_port + index if args.metrics_port else 0
            command += ["--metrics-port", str(port), "--metrics-host", args.metrics_host]
            command += ["--metrics-refresh", repr(args.metrics_refresh)]
        commands.append(command)
    return commands


class ParentLink:
    """A supervised worker's end of its link to the supervisor: its stdin, a socket (see
    the module's documentation), on which the supervisor writes a line per request."""

    def __init__(self) -> None:
        self._socket = trio.socket.fromfd(0, socket.AF_UNIX, socket.SOCK_STREAM)
        self._buffer = b""

    async def ready(self) -> None:
        try:
            await self._socket.send(READY)
        except OSError:
            pass  # the supervisor is gone: receive says so

    async def receive(self) -> tuple[str, str] | None:
        while b"\n" not in self._buffer:
            try:
                chunk = await self._socket.recv(256)
            except OSError:
                chunk = b""
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        what, _, name = line.decode(errors="replace").partition(" ")
        return what, name


def _status(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Fleet:
    """The worker processes of one supervisor, one slot each."""

    def __init__(self, commands: Sequence[Sequence[str]]) -> None:
        self.commands = commands
        self.processes: dict[int, trio.Process] = {}
        self.links: dict[int, socket.socket] = {}  # the supervisor's end of each live worker's link
        self.stopping = trio.Event()
        self.served = trio.Event()  # a worker served its queues (the application and storage work)
        self.forced = False
        self.failure: str | None = None

    def live(self) -> list[trio.Process]:
        return [p for p in self.processes.values() if p.returncode is None]

    def stop(self, signum: int) -> None:
        """Forward ``signum`` to every live worker, a graceful stop (a forced one once
        :attr:`forced`); from the first time on, nothing is restarted. A request on its
        link, not a signal: two signals sent at once can arrive as one."""
        self.stopping.set()
        for index in self.processes:
            self._request(index, signum)

    def _request(self, index: int, signum: int) -> None:
        line = f"{'force' if self.forced else 'stop'} {signal.Signals(signum).name}\n".encode()
        link = self.links.get(index)
        if link is not None:
            try:
                link.send(line)
            except OSError:
                pass  # it exited

    async def keep_running(self, index: int) -> None:
        """Run worker ``index`` until the fleet stops, restarting it when it exits."""
        backoff, failures = INITIAL_BACKOFF, 0
        while not self.stopping.is_set():
            began = trio.current_time()
            pid, code, served = await self._run_once(index)
            if self.stopping.is_set():
                logger.info("worker process %d (pid %d) stopped (%s)", index, pid, _status(code))
                return
            failures = 0 if served else failures + 1
            if not self.served.is_set():  # none ever served: a broken application or storage
                self.failure = f"worker process {index} exited before serving its queues ({_status(code)}); giving up"
                logger.error("%s", self.failure)
                self.stop(signal.SIGTERM)
                return
            if failures >= START_ATTEMPTS:
                self.failure = (
                    f"worker process {index} exited before serving its queues {failures} times in a row "
                    f"(last: {_status(code)}); giving up"
                )
                logger.error("%s: stopping the other worker processes", self.failure)
                self.stop(signal.SIGTERM)
                return
            if trio.current_time() - began >= RESET_AFTER:
                backoff = INITIAL_BACKOFF
            logger.warning(
                "worker process %d (pid %d) exited (%s)%s; restarting it in %g s",
                index,
                pid,
                _status(code),
                "" if served else " before serving its queues",
                backoff,
            )
            with trio.move_on_after(backoff):
                await self.stopping.wait()
            backoff = min(backoff * 2, MAX_BACKOFF)

    async def _run_once(self, index: int) -> tuple[int, int, bool]:
        """Start worker ``index`` and wait for its exit: its pid, exit code, and whether it
        had served its queues. If this task is cancelled, the worker is killed."""
        ours, theirs = socket.socketpair()
        with ours:
            try:
                process = await trio.lowlevel.open_process(
                    self.commands[index], stdin=theirs.fileno(), process_group=0
                )
            finally:
                theirs.close()
            self.processes[index], self.links[index] = process, ours
            ours.setblocking(False)
            logger.info("worker process %d started (pid %d)", index, process.pid)
            if self.stopping.is_set():  # the stop came while it started
                self._request(index, signal.SIGTERM)
            try:
                async with trio.open_nursery() as watching:
                    watching.start_soon(self._notice_ready, ours)
                    code = await process.wait()
                    watching.cancel_scope.cancel()
            finally:
                del self.links[index]
                if process.returncode is None:
                    process.kill()
                    with trio.CancelScope(shield=True):
                        await process.wait()
            try:
                served = READY in ours.recv(len(READY))
            except OSError:  # nothing written: BlockingIOError
                served = False
        return process.pid, code, served

    async def _notice_ready(self, link: socket.socket) -> None:
        """Set :attr:`served` when the worker at the other end of ``link`` says it serves
        (the line stays on the link, read again once it exits)."""
        await trio.lowlevel.wait_readable(link)
        try:
            if READY in link.recv(len(READY), socket.MSG_PEEK):
                self.served.set()
        except OSError:
            pass

    async def watch(self, signals: AsyncIterator[int], nursery: trio.Nursery) -> None:
        """Forward signals: the first stops gracefully, the second forces (and kills after
        :data:`KILL_AFTER`), the third kills."""
        seen = 0
        async for signum in signals:
            seen += 1
            name = signal.Signals(signum).name
            if seen == 1:
                logger.info(
                    "received %s: stopping the %d worker processes gracefully (running jobs finish); "
                    "send it again to force",
                    name,
                    len(self.live()),
                )
                self.stop(signum)
            elif seen == 2:
                logger.warning(
                    "received %s again: forcing the stop of the worker processes (running jobs go back to the "
                    "queue); those still running in %g s are killed",
                    name,
                    KILL_AFTER,
                )
                self.forced = True
                self.stop(signum)
                nursery.start_soon(self.kill_after, KILL_AFTER)
            else:
                logger.warning("received %s a third time: killing the worker processes", name)
                self.kill()

    async def kill_after(self, delay: float) -> None:
        await trio.sleep(delay)
        if self.live():
            logger.warning("killing the %d worker processes still running %g s after the forced stop", len(self.live()), delay)
            self.kill()

    async def first_outcome(self) -> None:
        """Wait until a worker serves or the fleet stops."""
        async with trio.open_nursery() as nursery:

            async def wait(event: trio.Event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(wait, self.served)
            nursery.start_soon(wait, self.stopping)

    def kill(self) -> None:
        for process in self.live():
            process.kill()


async def supervise(commands: Sequence[Sequence[str]]) -> int:
    """Run one worker process per command (see the module's documentation) until a signal
    stops them; the exit code: 0 graceful, 130 forced. Raises ``TrioQueueError`` when a
    worker keeps failing to start."""
    fleet = _Fleet(commands)
    with trio.open_signal_receiver(*_SIGNALS) as signals:
        async with trio.open_nursery() as outer:
            outer.start_soon(fleet.watch, signals, outer)
            logger.info("supervisor starting %d worker processes", len(commands))
            async with trio.open_nursery() as slots:
                # worker 0 alone first: one that cannot start (a broken application, a
                # storage that is not there) is reported once, not by every worker
                slots.start_soon(fleet.keep_running, 0)
                await fleet.first_outcome()
                for index in range(1, len(commands)):
                    if not fleet.stopping.is_set():
                        slots.start_soon(fleet.keep_running, index)
            outer.cancel_scope.cancel()
    if fleet.failure is not None:
        raise TrioQueueError(fleet.failure)
    logger.info("supervisor stopped%s", " (forced)" if fleet.forced else "")
    return EXIT_INTERRUPTED if fleet.forced else EXIT_OK
