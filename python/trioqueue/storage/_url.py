"""``from_url``: one parser for every storage URL the CLI and applications accept."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from .._model._errors import ValidationError
from ._base import Storage

__all__ = ["from_url"]

_FORMS = (
    "memory://, file:///path (or a plain path), redis://, rediss://, redis+cluster://, rediss+cluster://,"
    " redis+sentinel://, rediss+sentinel://, postgresql://, postgres://"
)


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

    Raises :class:`~trioqueue.ValidationError` naming the URL for anything else.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValidationError(f"storage URL must be a non-empty string, got {url!r}")
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
            f"{url!r} needs PostgreSQL support: pip install 'trioqueue[postgres]' ({exc})"
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
