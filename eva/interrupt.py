"""A stop asked for by a signal: set by the handler, checked between steps.

An exception raised from a signal handler lands wherever the interpreter happens to be — inside
the compiled engine it aborted the process (``fatal: out of memory``, SIGABRT; a replay given
Ctrl-C in a long clock-driven stretch, issue 29). So the commands' handlers only :func:`ask`;
the engine's instant loop and the commands' loops call :func:`check` between steps, which
raises :class:`Interrupted` at a point where an exception is an ordinary one.
"""

from __future__ import annotations

STOP = [False]
"""Whether a stop was asked for (a list: the compiled engine reads it without a call)."""
HELD = [0]
"""How many callers hold signals to the flag (:func:`held`): the compiled engine may be at work
(0: interpreted code only — a handler may raise KeyboardInterrupt as Python's does)."""


class Interrupted(Exception):
    """A stop asked for by a signal, raised between two steps."""


def ask() -> None:
    STOP[0] = True


def asked() -> bool:
    return STOP[0]


def clear() -> None:
    STOP[0] = False


class held:  # used as ``with held():``, like contextlib's
    """Signals only ask for a stop while this is entered: the compiled engine may be at work."""

    def __enter__(self) -> None:
        HELD[0] += 1

    def __exit__(self, *_: object) -> None:
        HELD[0] -= 1


def check() -> None:
    """Raise :class:`Interrupted` if a stop was asked for."""
    if STOP[0]:
        raise Interrupted("interrupted")


__all__ = ["HELD", "STOP", "Interrupted", "ask", "asked", "check", "clear", "held"]
