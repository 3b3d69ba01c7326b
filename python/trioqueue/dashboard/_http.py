"""A minimal ASGI layer for the dashboard: requests, responses and a server-sent event
stream. A dozen routes need no framework, and owning the layer keeps everything on Trio
(nurseries, cancellation) with nothing between the app and Hypercorn."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs

__all__ = ["HTTPError", "Receive", "Request", "Response", "Scope", "Send", "redirect"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_FORM_BYTES = 64 * 1024

# Every response: no inline script or style may run (a stored payload that slipped past
# escaping still could not execute), no framing, no sniffing.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


class HTTPError(Exception):
    """Answer the request with ``status`` and a short text ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Request:
    """An HTTP request: method, path, query (first value of each name), headers
    (lower-case names), cookies, and the urlencoded form body (read on demand)."""

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.scope = scope
        self.receive = receive
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        self.query = {k: v[0] for k, v in query.items()}
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        self.cookies: dict[str, str] = {}
        if "cookie" in self.headers:
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(self.headers["cookie"])
            except CookieError:
                pass
            self.cookies = {k: m.value for k, m in jar.items()}
        self._form: dict[str, str] | None = None

    @property
    def full_path(self) -> str:
        qs = self.scope.get("query_string", b"").decode("latin-1")
        return self.path + ("?" + qs if qs else "")

    async def form(self) -> dict[str, str]:
        """The ``application/x-www-form-urlencoded`` body (at most 64 KiB)."""
        if self._form is not None:
            return self._form
        ctype = self.headers.get("content-type", "").split(";")[0].strip().lower()
        body = bytearray()
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise HTTPError(400, "client disconnected")
            body += message.get("body", b"")
            if len(body) > MAX_FORM_BYTES:
                raise HTTPError(413, "form too large")
            if not message.get("more_body", False):
                break
        if body and ctype != "application/x-www-form-urlencoded":
            raise HTTPError(415, "expected an application/x-www-form-urlencoded form")
        try:
            parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise HTTPError(400, "form is not UTF-8") from None
        self._form = {k: v[0] for k, v in parsed.items()}
        return self._form


class Response:
    """A complete response (HTML, JSON, text or a redirect)."""

    def __init__(
        self,
        body: bytes | str = b"",
        *,
        status: int = 200,
        content_type: str = "text/html; charset=utf-8",
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        self.body = body.encode() if isinstance(body, str) else body
        self.status = status
        self.content_type = content_type
        self.headers = list(headers or [])

    @classmethod
    def json(cls, value: Any, *, status: int = 200) -> Response:
        return cls(json.dumps(value), status=status, content_type="application/json")

    @classmethod
    def text(cls, text: str, *, status: int = 200) -> Response:
        return cls(text + "\n", status=status, content_type="text/plain; charset=utf-8")

    def set_cookie(self, name: str, value: str, *, max_age: int | None = None) -> None:
        """An HttpOnly, SameSite=Strict cookie for the whole site."""
        cookie = f"{name}={value}; Path=/; HttpOnly; SameSite=Strict"
        if max_age is not None:
            cookie += f"; Max-Age={max_age}"
        self.headers.append(("set-cookie", cookie))

    async def send(self, send: Send) -> None:
        headers = [
            (b"content-type", self.content_type.encode()),
            (b"content-length", str(len(self.body)).encode()),
            (b"cache-control", b"no-store"),
            *SECURITY_HEADERS,
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers),
        ]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


def redirect(location: str, *, status: int = 303) -> Response:
    return Response(b"", status=status, headers=[("location", location)])


def local_path(target: str | None, default: str = "/") -> str:
    """``target`` if it is a path on this site (``/...``, not ``//host``), else ``default``:
    redirects never leave the dashboard."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    if any(ord(c) < 32 for c in target):
        return default
    return target
