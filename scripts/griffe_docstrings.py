"""A Griffe extension for the documentation site (mkdocs.yml loads it for mkdocstrings).

trioqueue's docstrings are prose written with Sphinx roles (:class:`~trioqueue.Queue`,
:meth:`stop`) and reST literal blocks ("Example::"). mkdocstrings renders docstrings as
Markdown, where a role would show as raw text. This extension rewrites, in the docs build
only (the source is untouched):

- a role into inline code, linked to the object's page when the site documents it: the
  link is an *optional* cross-reference, so a target the site does not document (a
  private helper) stays plain code and never fails ``mkdocs build --strict``;
- a paragraph ending in ``::`` into one ending in ``:`` (the indented block after it is
  already a Markdown code block).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|data|mod|obj|exc|const):`([^`]+)`")
_TITLED = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^>]+)>$")


def _identifier(obj: griffe.Object, target: str) -> str | None:
    """The full path a role's target names, as seen from obj's scope (None: unknown)."""
    if target.startswith("trioqueue"):
        return target
    if target.startswith("."):  # a relative module: left as code
        return None
    head, _, rest = target.partition(".")
    scope: griffe.Object | None = obj
    while scope is not None:
        try:
            base = scope.resolve(head)
        except (griffe.NameResolutionError, Exception):  # noqa: BLE001 - any failure: no link
            scope = scope.parent
            continue
        return f"{base}.{rest}" if rest else base
    return None


def _rewrite(obj: griffe.Object, text: str) -> str:
    def role(match: re.Match[str]) -> str:
        content = match.group(1).strip()
        titled = _TITLED.match(content)
        if titled:
            title, target = titled.group("title"), titled.group("target")
        else:
            target = content.lstrip("~")
            title = target.rsplit(".", 1)[-1] if content.startswith("~") else target
        code = f"<code>{title}</code>"
        identifier = _identifier(obj, target)
        if identifier is None:
            return code
        return f'<autoref optional identifier="{identifier}">{code}</autoref>'

    text = _ROLE.sub(role, text)
    # reST's "text::" before a literal block reads "text:" in Markdown; a lone "::" goes.
    text = re.sub(r"(?m)^::[ \t]*$", "", text)
    text = re.sub(r"(?m)(\S)::[ \t]*$", r"\1:", text)
    return text


class SphinxRolesToMarkdown(griffe.Extension):
    """Rewrite Sphinx roles and reST literal-block markers in every docstring."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _rewrite(obj, obj.docstring.value)
