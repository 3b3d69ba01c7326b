"""A small blocking HTTP client for the dashboard tests (run in a thread under Trio)."""

from __future__ import annotations

import http.client
import re
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    cookies: dict[str, str]
    body: str

    def csrf(self) -> str:
        match = re.search(r'name="csrf" value="([0-9a-f]+)"', self.body)
        assert match, "no CSRF token in the page"
        return match.group(1)


@dataclass
class Client:
    """Keeps cookies like a browser; ``host`` overrides the Host header."""

    base: str
    cookies: dict[str, str] = field(default_factory=dict)

    def request(
        self,
        method: str,
        path: str,
        *,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        parts = urlsplit(self.base)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        hdrs = {"Accept": "text/html", **(headers or {})}
        if self.cookies:
            hdrs["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urlencode(form)
            hdrs["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            text = resp.read().decode()
            got: dict[str, str] = {}
            for key, value in resp.getheaders():
                if key.lower() == "set-cookie":
                    name, _, rest = value.partition("=")
                    got[name] = rest.split(";")[0]
            for name, value in got.items():
                if value:
                    self.cookies[name] = value
                else:
                    self.cookies.pop(name, None)
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, got, text)
        finally:
            conn.close()

    def get(self, path: str, **kw: object) -> Reply:
        return self.request("GET", path, **kw)  # type: ignore[arg-type]

    def post(self, path: str, form: dict[str, str], **kw: object) -> Reply:
        return self.request("POST", path, form=form, **kw)  # type: ignore[arg-type]


class EventReader:
    """Reads a server-sent event stream: ``next()`` returns ``(event, data)``."""

    def __init__(self, base: str, path: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(base)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        self.conn.request("GET", path, headers=headers or {})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status

    def next(self) -> tuple[str, str]:
        name, data = "", ""
        while True:
            line = self.resp.readline().decode()
            if not line:
                raise EOFError("event stream closed")
            line = line.rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and name:
                return name, data

    def close(self) -> None:
        self.conn.close()
