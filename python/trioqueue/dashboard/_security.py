"""Dashboard security: who may bind where, token authentication, CSRF, Host checks.

- Without ``auth_token`` the dashboard serves only loopback addresses, and answers only
  requests whose ``Host`` is a loopback name (a web page elsewhere cannot reach it through
  DNS rebinding).
- With ``auth_token`` every request must carry it, as ``Authorization: Bearer <token>`` or
  through the login form, which sets an HttpOnly, SameSite=Strict cookie holding a keyed
  hash of the token (never the token itself).
- Every action is a POST carrying a CSRF token: a keyed hash (a per-process secret) of the
  browser's session cookie, so another site can neither read nor forge it; cross-site
  requests (``Origin``/``Sec-Fetch-Site``) are refused as well. A request authenticated by
  the ``Authorization`` header (a script, not a browser) needs no CSRF token: browsers never
  add that header on their own.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from urllib.parse import urlsplit

from .._model._errors import ValidationError
from ._http import HTTPError, Request

__all__ = ["Security", "check_bind", "is_loopback"]

SESSION_COOKIE = "tq_session"
AUTH_COOKIE = "tq_auth"
_LOOPBACK_NAMES = {"localhost", "localhost.", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 possibly in brackets) is loopback."""
    host = host.strip().strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth_token: str | None) -> None:
    """Refuse to serve a non-loopback address without a token (``ValidationError``)."""
    if auth_token is not None and not auth_token.strip():
        raise ValidationError("--auth-token must not be empty")
    if auth_token is None and not is_loopback(host):
        raise ValidationError(
            f"refusing to serve the dashboard on {host!r} without --auth-token "
            "(only loopback addresses are served without authentication)"
        )


def _host_of(header: str) -> str:
    """The host name of a ``Host`` header value (``name:port``, ``[v6]:port``)."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class Security:
    """Authentication and CSRF checks for one dashboard process."""

    def __init__(self, auth_token: str | None) -> None:
        self.auth_token = auth_token
        self._secret = secrets.token_bytes(32)
        self._auth_cookie = (
            hmac.new(auth_token.encode(), b"trioqueue-dashboard-login", hashlib.sha256).hexdigest()
            if auth_token is not None
            else None
        )

    @property
    def auth_cookie(self) -> str | None:
        """The login cookie's value (``None`` when no token is required)."""
        return self._auth_cookie

    # -- authentication ------------------------------------------------------------------

    def bearer(self, request: Request) -> bool:
        """Whether the request carries the token in its Authorization header."""
        if self.auth_token is None:
            return False
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), self.auth_token.encode())

    def authenticated(self, request: Request) -> bool:
        if self.auth_token is None:
            return True
        if self.bearer(request):
            return True
        cookie = request.cookies.get(AUTH_COOKIE, "")
        assert self._auth_cookie is not None
        return hmac.compare_digest(cookie.encode(), self._auth_cookie.encode())

    def token_matches(self, token: str) -> bool:
        return self.auth_token is not None and hmac.compare_digest(token.encode(), self.auth_token.encode())

    def check_host(self, request: Request) -> None:
        """Without a token, only loopback ``Host`` names are answered (DNS rebinding)."""
        if self.auth_token is not None:
            return
        if not is_loopback(_host_of(request.headers.get("host", ""))):
            raise HTTPError(421, "this dashboard answers loopback host names only (start it with --auth-token)")

    # -- CSRF ----------------------------------------------------------------------------

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(24)

    @staticmethod
    def session(request: Request) -> str | None:
        value = request.cookies.get(SESSION_COOKIE)
        return value if value and 16 <= len(value) <= 64 and value.isascii() else None

    def csrf_token(self, session: str) -> str:
        return hmac.new(self._secret, b"csrf:" + session.encode(), hashlib.sha256).hexdigest()

    def check_post(self, request: Request, form: dict[str, str]) -> None:
        """A state-changing request: same-site, and with a valid CSRF token (unless it is
        authenticated by the Authorization header)."""
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            raise HTTPError(403, "cross-site request refused")
        origin = request.headers.get("origin")
        if origin and origin != "null":
            if urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower():
                raise HTTPError(403, "cross-origin request refused")
        if self.bearer(request):
            return
        session = self.session(request)
        token = form.get("csrf", "")
        if session is None or not hmac.compare_digest(token.encode(), self.csrf_token(session).encode()):
            raise HTTPError(403, "missing or invalid CSRF token (reload the page)")
