"""The SQL of PostgresStorage, in named files beside this module, loaded once at import.

``sql/<name>.sql``: one statement a file, used by name (``self._sql["claim_plain"]``),
after the ``--`` comment lines that may open the file (its notes, not sent);
``sql/migrations/<version>.sql``: one migration a file (see :mod:`._schema`). The text
of a statement is sent as it is in its file (the trailing newline aside): the prepared
statements of a connection are keyed by their text, and the plans a statement gets
depend on how it is written (see the comments in the claims).

In a statement, ``{s}`` stands for the quoted schema name (``"trioqueue"``) and
``{schema}`` for the bare one (inside a literal: ``nextval('{schema}.job_seq')``); they
are replaced once per schema (:func:`statements`). A migration is a ``str.format``
template with ``{s}`` (literal braces doubled).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping
from importlib import resources

__all__ = ["MIGRATION_TEXTS", "STATEMENTS", "statements"]


def _load(folder: str, *, header: bool) -> dict[str, str]:
    """The ``.sql`` files of ``folder`` (under this package) by name, without the suffix
    and the final newline (``header``: and without the ``--`` comment lines that open
    the file, the statement's notes)."""
    root = resources.files(__package__).joinpath(folder)
    found = {}
    for item in root.iterdir():
        if item.name.endswith(".sql"):
            text = item.read_text(encoding="utf-8").removesuffix("\n")
            while header and text.startswith("--"):
                text = text.partition("\n")[2]
            found[item.name.removesuffix(".sql")] = text
    return found


#: the statements by name, with the ``{s}`` and ``{schema}`` placeholders
STATEMENTS: Mapping[str, str] = types.MappingProxyType(_load("sql", header=True))
#: the migrations' texts by file name (``0001``...), ``str.format`` templates of ``{s}``
MIGRATION_TEXTS: Mapping[str, str] = types.MappingProxyType(_load("sql/migrations", header=False))


@functools.cache
def statements(schema: str) -> Mapping[str, str]:
    """The statements by name, for the (checked) schema name ``schema``."""
    quoted = f'"{schema}"'
    return types.MappingProxyType(
        {name: text.replace("{s}", quoted).replace("{schema}", schema) for name, text in STATEMENTS.items()}
    )
