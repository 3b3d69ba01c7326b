"""A TCP proxy (a Trio task of the test) in front of a real server, that can black-hole
the network: :meth:`BlackHoleProxy.black_hole` makes every connection open at that time,
and every one accepted until :meth:`BlackHoleProxy.heal`, swallow what either side sends
and never close, as a network that drops packets does. Connections accepted after
``heal()`` are forwarded again; the black-holed ones stay dead (as after a partition that
lost the connections' state)."""

from __future__ import annotations

import trio

__all__ = ["BlackHoleProxy"]


class _Link:
    __slots__ = ("dead",)

    def __init__(self, dead: bool) -> None:
        self.dead = dead


class BlackHoleProxy:
    """Listens on 127.0.0.1 (``port`` once started) and forwards to ``host``:``target``.
    Start with ``await nursery.start(proxy.serve)``."""

    def __init__(self, host: str, target: int) -> None:
        self.host = host
        self.target = target
        self.port = 0
        self._holed = False
        self._links: set[_Link] = set()

    def black_hole(self) -> None:
        self._holed = True
        for link in self._links:
            link.dead = True

    def heal(self) -> None:
        self._holed = False

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        link = _Link(self._holed)
        self._links.add(link)
        try:
            async with client:
                if link.dead:
                    await self._swallow(client)
                    return
                async with await trio.open_tcp_stream(self.host, self.target) as upstream, trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, link, client, upstream, nursery.cancel_scope)
                    nursery.start_soon(self._pump, link, upstream, client, nursery.cancel_scope)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            self._links.discard(link)

    @staticmethod
    async def _swallow(stream: trio.SocketStream) -> None:
        while await stream.receive_some():
            pass
        await trio.sleep_forever()  # (the peer closed: a black hole does not answer that either)

    @staticmethod
    async def _pump(link: _Link, src: trio.SocketStream, dst: trio.SocketStream, scope: trio.CancelScope) -> None:
        while data := await src.receive_some():
            if not link.dead:
                await dst.send_all(data)
        if not link.dead:
            scope.cancel()  # one side closed: close the other
        else:
            await trio.sleep_forever()
