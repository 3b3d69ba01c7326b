"""The ``trioqueue`` command line: ``worker``, ``demo``, ``bench``, the admin commands
(``stats``, ``list``, ``show``, ``cancel``, ``retry``, ``remove``, ``purge``, ``pause``,
``resume``, ``enqueue``) and ``dashboard``; ``trioqueue --help`` lists them.

:mod:`._main` parses and dispatches; :mod:`._run` holds what every command shares (exit
codes, one-line errors); one module per command or group of commands."""

from ._main import main

__all__ = ["main"]
