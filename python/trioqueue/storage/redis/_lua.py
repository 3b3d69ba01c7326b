"""The Lua scripts of :class:`~trioqueue.storage.redis.RedisStorage`, one ``.lua`` file per
atomic command in ``scripts/`` (shipped as package data), BullMQ-style,  generated
from the one declaration of the key layout (:mod:`._keys`).

A line ``--@include <name>`` splices in the shared fragment ``scripts/include/<name>.lua``
(``prelude``: the key variables, event encoding and helpers; ``enqueue``: the body of
``enqueue``, which ``schedule_tick`` runs too; ``delay``: jobs entering the delayed set;
``promote``, ``cancel``, ``flow_claim``/``flow_free``: flow control, whose keys come last
in KEYS; ``queues``: scripts acting on several queues, ``tree``: trees of jobs).
Every key a script touches is declared in ``KEYS`` (Redis Cluster and ACL key patterns
depend on it), all under the queue's hash tag (:func:`queue_base`), in the order of
:func:`queue_keys`, but each script is sent only those it uses (:func:`script_keys`); a
script that touches a worker's processing list gets it after them. A script acting on
several queues (a tree of jobs across queues: ``tree_act``, ``flow_enqueue``,
``flow_add``) is sent those keys of each queue in turn, and told the queues' names.
Per-job data lives in fields of per-queue hashes, so no key is ever derived from data at
run time. Scripts are loaded once per process (EVALSHA; reloaded on NOSCRIPT).

:func:`library` gives each script a second form, a Redis Function library (Redis 7+,
Valkey): a script's text runs whole on every EVALSHA, so its leading ``local``
definitions (the prelude's helpers: ~33,000 of an ``enqueue`` call's ~205,000 server
instructions) are made anew each call; in a library its functions and constant
literals are made once, at ``FUNCTION LOAD``, and the callback only assigns the
per-call values (keys, state tables) before running the script's body.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources

from ..._model._types import DEFAULT_PRIORITY, MAX_PRIORITY
from .._records import NOTICE_KINDS
from ._keys import QUEUE_KEY_NAMES, QUEUE_KEYS, hash_slot, queue_base, queue_keys

__all__ = [
    "QUEUE_KEYS",
    "QUEUE_KEY_NAMES",
    "SCRIPT_NAMES",
    "SMALL",
    "UNACKED_SCRIPTS",
    "VARIANTS",
    "hash_slot",
    "keys_of",
    "library",
    "queue_base",
    "queue_keys",
    "script_keys",
    "source",
]

SMALL = 65536  # results/errors up to this size ride along in events (the prelude's SMALL)


SCRIPT_NAMES = (
    "enqueue",
    "enqueue_plain",
    "debounce",
    "claim",
    "settle",
    "release",
    "start",
    "cancel",
    "get_job",
    "get_jobs",
    "get_envelope",
    "update_ttl",
    "heartbeat",
    "unregister",
    "workers",
    "recover",
    "sweep",
    "progress",
    "step",
    "signal",
    "pause",
    "schedule_put",
    "schedule_remove",
    "schedule_get",
    "schedule_tick",
    "lock_acquire",
    "lock_release",
    "counts",
    "list_jobs",
    "retry",
    "purge",
    "remove",
    "clear",
    "flow_enqueue",
    "flow_add",
    "tree_act",
    "group_pause",
    "group_requeue",
)

# Scripts after which an acknowledged write waits for no replica: they only read, or what
# a failover may take of their effect costs no job (a claim lost with the old primary
# leaves its jobs queued, to run again: at least once; heartbeats are sent again; expired
# jobs are swept again; the reaper's lock is taken again).
UNACKED_SCRIPTS = frozenset(
    {"get_job", "get_jobs", "get_envelope", "counts", "list_jobs", "workers", "schedule_get",
     "claim", "heartbeat", "sweep", "lock_acquire", "lock_release"}
)  # fmt: skip

_INCLUDE = re.compile(r"^--@include (\w+)$", re.MULTILINE)

# Variants: another script's text with some of its fragments' definitions replaced, as
# name -> (script, {replaced definition: replacement}). ``enqueue_plain`` serves the
# batches whose jobs all have the default priority and no group: with no other
# priorities' lanes and no groups' keys it is sent 11 keys fewer, about 12,000 server
# instructions a call (A-seq makes one call a job).
VARIANTS = {
    "enqueue_plain": (
        "enqueue",
        {
            "LANES": "-- (enqueue_plain: every job of the batch has the default priority, so no other lane)\n"
            "local LANES = {}\n",
            "push_grouped": "-- (enqueue_plain: no job of the batch has a group)\nlocal function push_grouped(grouped) end\n",
        },
    ),
}


def _read(name: str) -> str:
    """The file of script ``name`` (of a variant: its script's), in ``scripts/``."""
    name = VARIANTS[name][0] if name in VARIANTS else name
    return resources.files(__package__).joinpath("scripts", f"{name}.lua").read_text(encoding="utf-8")


def _read_fragment(name: str) -> str:
    """The fragment ``name`` (``scripts/include/``), with what the prelude takes from the
    Python declarations generated in place: ``--@layout`` (the key variables and the
    lanes, from :data:`QUEUE_KEYS`), ``--@notices`` (the ``NOTICE`` table, from
    ``NOTICE_KINDS``) and ``--@small`` (:data:`SMALL`)."""
    text = resources.files(__package__).joinpath("scripts", "include", f"{name}.lua").read_text(encoding="utf-8")
    return text.replace("--@layout\n", layout_lua()).replace("--@notices\n", notices_lua()).replace(
        "--@small\n", f"local SMALL = {SMALL}\n"
    )


def layout_lua() -> str:
    """The prelude's key variables, ``local JOBS = KEYS[1]`` and so on, and its ready
    list in lanes by priority (``LANES``, 0 first: the default priority's lane is ``Q``)."""
    lines = [f"local {var} = KEYS[{i}]\n" for i, (var, _) in enumerate(QUEUE_KEYS, start=1) if var is not None]
    lane_keys = iter(f"KEYS[{i}]" for i, (var, _) in enumerate(QUEUE_KEYS, start=1) if var is None)
    lanes = ["Q" if p == DEFAULT_PRIORITY else next(lane_keys) for p in range(MAX_PRIORITY + 1)]
    lines.append(f"local LANES = {{{', '.join(lanes)}}}\n")
    lines.append(f"local DEFAULT_PRIORITY = {DEFAULT_PRIORITY}\n")
    return "".join(lines)


def notices_lua() -> str:
    """The prelude's ``NOTICE`` table: the kinds also published on the notices channel."""
    return "local NOTICE = {" + ", ".join(f"{kind} = true" for kind in sorted(NOTICE_KINDS)) + "}\n"


def source(name: str) -> str:
    """The text of script ``name``: its ``--@include`` lines replaced by the fragments,
    and of a fragment made only of top-level ``local`` definitions (the prelude, say), only
    the definitions the script uses, directly or through other definitions. A queue script
    (one that includes the prelude) is numbered for the KEYS of :func:`script_keys`."""
    return _layout(name)[0]


def script_keys(name: str) -> tuple[int, ...]:
    """The positions in :data:`QUEUE_KEY_NAMES` of the queue keys script ``name`` is sent,
    in KEYS order (a worker's processing lists and the flow keys follow them); ``()`` for
    a script that is not a queue script (the locks')."""
    return _layout(name)[1]


def keys_of(name: str, base: str) -> list[str]:
    """The queue keys script ``name`` is sent, for the queue whose keys start with
    ``base`` (``{prefix:queue}``)."""
    return [f"{base}:{QUEUE_KEY_NAMES[i]}" for i in script_keys(name)]


_KEY_REF = re.compile(r"KEYS\[(\d+)\]")
_TRAILING_COMMENT = re.compile(r"--.*$", re.MULTILINE)


@cache
def _layout(name: str) -> tuple[str, tuple[int, ...]]:
    """A script sent all 29 queue keys pays about 1,100 server instructions per key and
    call: a queue script gets only those its spliced text names (outside comments), its
    ``KEYS[n]`` renumbered in that order, and ``QK`` (the count) defined first."""
    text = _splice(name)
    if "--@include prelude" not in _read(name):
        return text, ()
    code = _TRAILING_COMMENT.sub("", text)
    used = sorted({int(n) for n in _KEY_REF.findall(code) if 1 <= int(n) <= len(QUEUE_KEY_NAMES)})
    at = {n: i for i, n in enumerate(used, start=1)}
    text = _KEY_REF.sub(lambda m: f"KEYS[{at.get(int(m.group(1)), m.group(1))}]", text)
    if "QK" in _words(text):
        text = f"local QK = {len(used)}\n" + text
    return _rekey(text), tuple(n - 1 for n in used)


_BOUND = re.compile(r"^local (\w+) = KEYS\[(\d+)\]$", re.MULTILINE)
_BOUND_LANES = re.compile(r"^local LANES = (\{.*\})$", re.MULTILINE)


def _rekey(text: str) -> str:
    """Fill in ``use_queue`` (fragment ``queues``) once the KEYS are numbered: the key
    variables the script binds (``local JOBS = KEYS[1]``...) and its lanes are pointed at
    the keys of the queue at offset ``o`` (``K[o + n]``, ``K``: the call's KEYS); ``--@due``: the delayed set's
    per-call state published and reset, if the script has one."""
    if "  --@rekey\n" not in text:
        return text
    lines = [f"  {var} = K[o + {n}]\n" for var, n in _BOUND.findall(text)]
    lanes = _BOUND_LANES.search(text)
    if lanes:
        lines.append("  LANES = " + _KEY_REF.sub(lambda m: f"K[o + {m.group(1)}]", lanes.group(1)) + "\n")
    due = ""
    if "local function due_flush(" in text:
        due += "  due_flush()\n"
    if "local DUE_FIRST" in text:
        due += "  DUE_FIRST = nil\n"
    return text.replace("  --@due\n", due).replace("  --@rekey\n", "".join(lines))


def _swapped(d: _Definition, replacements: dict[str, str]) -> _Definition:
    """Definition ``d``, or its variant's replacement."""
    for replaced, text in replacements.items():
        if replaced in d.names:
            return _Definition({replaced}, text)
    return d


def _splice(name: str) -> str:
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no Redis script named {name!r}")
    parts: list[str | list[_Definition]] = []
    pos, text = 0, _read(name)
    swap = VARIANTS.get(name)
    for m in _INCLUDE.finditer(text):
        parts.append(text[pos : m.start()])
        fragment = _fragment(m.group(1))
        if isinstance(fragment, str):
            parts.append(fragment)
        else:
            parts.append([_swapped(d, swap[1]) if swap else d for d in fragment])
        pos = m.end()
    parts.append(text[pos:])
    # The names the script's own code (and the fragments spliced in as code) mentions,
    # then, to a fixed point, those of the definitions that provide them. Over-counting
    # (a name in a comment or a string) only keeps a definition that could have gone.
    wanted = _words("".join(p for p in parts if isinstance(p, str)))
    left = [d for p in parts if isinstance(p, list) for d in p]
    kept: set[_Definition] = set()
    grew = True
    while grew:
        grew = False
        for d in left:
            if d not in kept and d.names & wanted:
                kept.add(d)
                wanted |= d.uses
                grew = True
    return "".join(p if isinstance(p, str) else "".join(d.text for d in p if d in kept) for p in parts)


# Running a script runs its whole text first: every ``local function`` of the prelude
# makes a closure on every call (~60k instructions for all of them, as much as the rest
# of an EVALSHA's overhead), so a script carries only the definitions it uses.
_WORD = re.compile(r"[A-Za-z_]\w*")
_COMMENT_LINE = re.compile(r"^\s*--.*$", re.MULTILINE)
_TOP = re.compile(r"^local (?:function (\w+)|([\w, ]+?)\s*(?:=|$))")


class _Definition:
    __slots__ = ("names", "text", "uses")

    def __init__(self, names: set[str], text: str) -> None:
        self.names = names
        self.text = text
        self.uses = _words(text) - names


def _words(code: str) -> set[str]:
    """The names ``code`` mentions outside its whole-line comments."""
    return set(_WORD.findall(_COMMENT_LINE.sub("", code)))


@cache
def _fragment(name: str) -> str | tuple[_Definition, ...]:
    """Fragment ``name`` as its definitions, or as text if it is code (read once)."""
    text = _read_fragment(name)
    defs = _definitions(text)
    return text if defs is None else tuple(defs)


def _definitions(fragment: str) -> list[_Definition] | None:
    """``fragment`` as its top-level definitions, each with the lines up to the next one;
    None if it holds anything else at the top level (code that runs where it is spliced)."""
    lines = fragment.splitlines(keepends=True)
    defs, used = _leading_definitions(lines)
    return defs if used == len(lines) else None


def _leading_definitions(lines: list[str]) -> tuple[list[_Definition], int]:
    """The top-level definitions ``lines`` start with, and how many lines they take (the
    blank and comment lines before the first other statement go with it, not them)."""
    defs: list[_Definition] = []
    above: list[str] = []  # blank and comment lines: they belong to the next definition
    used = 0
    for i, line in enumerate(lines):
        m = _TOP.match(line)
        if m:
            names = {m.group(1)} if m.group(1) else {n.strip() for n in m.group(2).split(",")}
            defs.append(_Definition(names, "".join(above) + line))
            above = []
        elif not line.strip() or line.startswith("--"):
            above.append(line)
            continue
        elif defs and (line[0] == " " or line.startswith(("end", "}"))):
            d = defs[-1]  # the rest of a definition
            d.text += "".join(above) + line
            above = []
        else:
            break
        used = i + 1
    for d in defs:
        d.uses = _words(d.text) - d.names
    complete = used == len(lines) - len(above)  # only comments after the last definition
    return defs, len(lines) if complete else used


# -- the Redis Function form -----------------------------------------------------------

_LITERAL = re.compile(r"^local \w+ = (?:-?\d+|'[^'\\]*')\s*(?:--.*)?$")  # a number or a plain string
_FUNCTION = re.compile(r"^local function \w+", re.MULTILINE)
_STRING = re.compile(r"'[^'\\\n]*'")


def _literal_table(definition: str) -> bool:
    """Whether ``local NAME = {...}`` builds a table of literals only: keys are names,
    values numbers, plain strings, ``true`` or ``false``."""
    m = re.match(r"local \w+ = (\{.*\})\s*$", _STRING.sub("''", _TRAILING_COMMENT.sub("", definition)).strip(), re.DOTALL)
    if not m or re.search(r"[\[\](){}]", m.group(1)[1:-1]):
        return False
    return all(w in ("true", "false") or re.match(r"\s*=[^=]", m.group(1)[e:]) is not None
               for w, e in ((x.group(), x.end()) for x in re.finditer(r"[A-Za-z_]\w*", m.group(1))))


def _read_only(name: str, code: str) -> bool:
    """Whether every use of ``name`` in ``code`` (its definition taken out) reads a field
    (``NAME[k]``, ``NAME.k``) and none assigns one, nor passes the table on."""
    for m in re.finditer(rf"(?<![\w.]){name}\b", code):
        rest = code[m.end() :]
        index = re.match(r"\[[^\[\]]*\]|\.\w+", rest)
        if index is None or re.match(r"\s*=(?!=)", rest[index.end() :]):
            return False
    return True


@cache
def library(name: str) -> tuple[str, str]:
    """``(function name, library code)``: script ``name`` as a Redis Function.

    The script's leading top-level definitions (up to its first other statement) are
    split: ``local function`` definitions, ``local`` number/string literals never
    assigned again and tables of literals only ever read are made once, at load; every
    other value (keys, ARGV-derived values, the per-call state tables) is declared at the
    library's top and assigned at each call's start, in the script's order, before its
    body runs.
    Redis runs one script at a time, so a call sees exactly the values it would have
    had as a fresh EVALSHA; the helpers keep referring to the same names. The names are
    the script's and a hash of the library's code, so two versions of trioqueue load
    side by side.
    """
    return _as_library(name, source(name))


def _as_library(name: str, text: str) -> tuple[str, str]:
    """:func:`library` of a script whose spliced ``text`` is given."""
    lines = text.splitlines(keepends=True)
    head, body_at = _leading_definitions(lines)
    names: list[str] = []
    for d in head:
        names.extend(sorted(d.names))
    if len(names) != len(set(names)):
        raise ValueError(f"script {name!r} defines a top-level name twice; it has no library form")
    code = _TRAILING_COMMENT.sub("", text)
    once: list[str] = []
    per_call: list[str] = []
    values: list[str] = []
    for d in head:
        lines_of = d.text.splitlines(keepends=True)
        first = next(i for i, line in enumerate(lines_of) if line.startswith("local "))
        if _FUNCTION.match(lines_of[first]):
            once.append(d.text)
            continue
        (n,) = d.names if len(d.names) == 1 else (None,)
        if n is not None:
            rest = code.replace(_TRAILING_COMMENT.sub("", "".join(lines_of[first:])), "", 1)
            if len(lines_of) == first + 1 and _LITERAL.match(lines_of[first].rstrip("\n")):
                constant = re.search(rf"(?<![\w.]){n}\s*=(?!=)", rest) is None
            else:
                constant = _literal_table("".join(lines_of[first:])) and _read_only(n, rest)
            if constant:
                once.append(d.text)
                continue
        values.extend(sorted(d.names))
        statement = lines_of[first][len("local ") :]
        if "=" not in _TRAILING_COMMENT.sub("", statement):  # ``local X``: nil each call
            statement = ", ".join(sorted(d.names)) + " = nil\n"
        per_call.append("".join(lines_of[:first]) + statement + "".join(lines_of[first + 1 :]))
    body = "".join(lines[body_at:])
    top = (f"local {', '.join(values)}\n" if values else "") + "".join(once)
    call = "".join(per_call) + body + ("" if body.endswith("\n") else "\n") + "end)\n"
    fname = f"trioqueue_{name}_{hashlib.sha1((top + call).encode()).hexdigest()[:16]}"
    return fname, f"#!lua name={fname}\n{top}redis.register_function('{fname}', function(KEYS, ARGV)\n{call}"
