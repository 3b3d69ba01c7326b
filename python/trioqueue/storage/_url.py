"""``from_url``: one parser for every storage URL the CLI and applications accept."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urlsplit

from .._model._errors import ValidationError, install_hint
from ._base import Storage

__all__ = ["check_storage_url", "from_url"]

_FORMS = (
    "memory://, file:///path (or a plain path), redis://, rediss://, redis+cluster://, rediss+cluster://,"
    " redis+sentinel://, rediss+sentinel://, postgresql://, postgres://"
)
_ACCEPTED = (
    "a storage URL is memory://, file:///path, a directory path (./jobs, /var/lib/jobs), redis://host:port[/db]"
    " (also rediss://, valkey://, redis+cluster://, redis+sentinel://) or postgresql://user@host:port/dbname"
)
_SCHEMES = (
    "memory", "file", "redis", "rediss", "valkey", "valkeys", "postgresql", "postgres",
    *(f"{base}+{kind}" for base in ("redis", "rediss", "valkey", "valkeys") for kind in ("cluster", "sentinel")),
)  # fmt: skip
# A known scheme name alone, or followed by ":" or "//" that is not "://" ("redis:/h:1", "redis//h:1").
_MISTYPED_SCHEME = re.compile(
    r"(?P<scheme>" + "|".join(re.escape(s) for s in sorted(_SCHEMES, key=len, reverse=True)) + r")"
    r"(?P<sep>$|:(?!//)|//)",
    re.IGNORECASE,
)
# host:port[/...], [user@]host:port (a drive letter "C:" is not a host)
_HOST_PORT = re.compile(r"(?:[^/@\\]+@)?(?P<host>[A-Za-z0-9._-]{2,}|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})(?:/.*)?")


def check_storage_url(url: str) -> None:
    """Raise :class:`~trioqueue.ValidationError` naming ``url`` when it is no storage URL
    :func:`from_url` accepts: not a non-empty string, an unsupported scheme, or a mistyped
    one that would otherwise be taken for a directory path (``redis:/host:6379``,
    ``redis//host:6379``, ``localhost:6379``, ``redis``). Creates nothing."""
    if not isinstance(url, str) or not url.strip():
        raise ValidationError(f"storage URL must be a non-empty string, got {url!r}")
    if "://" not in url:
        mistyped = _MISTYPED_SCHEME.match(url)
        if mistyped:
            scheme = mistyped.group("scheme").lower()
            rest = url[mistyped.end() :].lstrip(":/")
            if rest or scheme == "memory":
                hint = f"did you mean {scheme}://{'/' if scheme == 'file' else ''}{rest}?"
            else:
                hint = f"a directory of that name is ./{url}"
            raise ValidationError(f"{url!r} is not a storage URL: {scheme!r} must be followed by '://' ({hint}); {_ACCEPTED}")
        host_port = _HOST_PORT.fullmatch(url)
        if host_port:
            raise ValidationError(
                f"{url!r} is not a storage URL: it looks like host:port, which needs a scheme (like"
                f" redis://{url}; a directory of that name is ./{url}); {_ACCEPTED}"
            )
        return
    scheme = urlsplit(url).scheme.lower()
    if scheme not in _SCHEMES:
        raise ValidationError(f"unsupported storage URL scheme {scheme!r} in {url!r} (use {_FORMS})")


def from_url(url: str, **options: Any) -> Storage:
    """The storage a URL names; ``options`` go to its constructor (e.g. ``prefix=`` for
    Redis, ``fsync=`` for files).

    - ``memory://`` — :class:`~trioqueue.MemoryStorage` (this process only);
    - ``file:///var/lib/jobs`` or a plain path — :class:`~trioqueue.FileStorage`;
    - ``redis://[user[:password]@]host[:port][/db]``, ``rediss://`` (TLS), also spelled
      ``valkey://`` / ``valkeys://`` — :class:`~trioqueue.RedisStorage`;
      ``redis+cluster://host:port`` (or ``rediss+cluster://``) for Redis Cluster;
      ``redis+sentinel://host1:26379,host2:26379/mymaster[/db]`` (or ``rediss+sentinel://``)
      for the primary of a Redis Sentinel service (``?sentinel_password=`` for the
      sentinels' own password; ``?replica_ack_timeout=1.0`` for acknowledged writes, on
      any Redis URL);
    - ``postgresql://[user[:password]@]host[:port]/dbname[?...]`` (or ``postgres://``) —
      :class:`~trioqueue.storage.postgres.PostgresStorage` (query parameters ``schema``,
      ``synchronous_commit=on|off``, ``prepared_statements=on|off`` and ``call_timeout``
      (seconds) set those options; the others go to libpq).

    Raises :class:`~trioqueue.ValidationError` naming the URL for anything else, creating
    nothing: also for a mistyped URL that a directory path would otherwise be made of (a
    known scheme without ``://``, like ``redis:/host:6379``, ``redis//host:6379`` or
    ``redis``, and ``host:port``); ``./redis`` or ``./localhost:6379`` name such a directory.
    """
    check_storage_url(url)
    if "://" not in url:  # a plain path (also a Windows one: "C:\\jobs")
        from .file import FileStorage

        return FileStorage(url, **options)
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        from .memory._storage import MemoryStorage

        if urlsplit(url).netloc or urlsplit(url).path.strip("/"):
            raise ValidationError(f"memory:// takes no location, got {url!r}")
        return MemoryStorage(**options)
    if scheme == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ValidationError(f"file URLs name a local directory (file:///path), got host {parts.netloc!r} in {url!r}")
        if not parts.path:
            raise ValidationError(f"file URL without a path: {url!r}")
        from .file import FileStorage

        return FileStorage(unquote(parts.path), **options)
    if scheme.endswith("+sentinel") and scheme[: -len("+sentinel")] in ("redis", "rediss", "valkey", "valkeys"):
        from .redis import RedisStorage

        return RedisStorage(url, **options)  # its URL parser reads the sentinels and the service
    cluster = False
    if scheme.endswith("+cluster"):
        cluster, scheme = True, scheme[: -len("+cluster")]
        url = scheme + url[url.index("://") :]
    if scheme in ("redis", "rediss", "valkey", "valkeys"):
        from .redis import RedisStorage

        return RedisStorage(url, cluster=cluster, **options)
    if scheme in ("postgresql", "postgres"):
        return _postgres(url, options)
    raise ValidationError(f"unsupported storage URL scheme {scheme!r} in {url!r} (use {_FORMS})")


def _postgres(url: str, options: dict[str, Any]) -> Storage:
    from urllib.parse import parse_qsl, urlencode, urlunsplit

    try:
        from .postgres import PostgresStorage
    except ImportError as exc:  # psycopg is the ``postgres`` extra
        raise ValidationError(
            f"{url!r} {install_hint('postgres', 'psycopg')} ({exc})"
        ) from exc
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in ("schema", "synchronous_commit", "prepared_statements", "call_timeout")}
    if "call_timeout" in ours:
        try:
            ours["call_timeout"] = float(ours["call_timeout"])  # type: ignore[assignment]
        except ValueError:
            raise ValidationError(
                f"call_timeout must be a number of seconds, got {ours['call_timeout']!r} in {url!r}"
            ) from None
    for flag in ("synchronous_commit", "prepared_statements"):
        if flag in ours:
            value = ours[flag].lower()
            if value not in ("on", "off"):
                raise ValidationError(f"{flag} must be on or off, got {value!r} in {url!r}")
            ours[flag] = value == "on"  # type: ignore[assignment]
    if ours:
        options = {**ours, **options}
        parts = parts._replace(query=urlencode([(k, v) for k, v in query if k not in ours]))
    try:
        return PostgresStorage(urlunsplit(parts), **options)
    except ValueError as exc:
        raise ValidationError(f"{exc} (in {url!r})") from exc
