"""The composer: where the mediator composes events into composites outside the plan runners.

One small protocol — register or remove profiles, feed events, collect composites and dead
letters — with two implementations: ``InProcessComposer`` (here: the engine in this process)
and ``spark_jobs.composer.SparkComposer`` (the streaming job in local mode, or on a cluster),
which satisfies the protocol structurally: spark_jobs sits below the mediator and does not
import it. The service's pipeline (:mod:`mediator.pipeline`) composes through live
``SparkComposer`` s (:class:`LiveComposer`: they read the composer log themselves,
:mod:`mediator.placement`) with ``composer = "spark"``, the default: the profiles whose leaves
are filters of one class; everything else — and everything with ``"inprocess"`` — runs in the
federations' plan runners.
``InProcessComposer`` is the protocol's reference implementation the Spark one is tested
against (docs/spark.md, "What runs where in the mediator service").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from eva.engine import Engine, EngineConfig
from eva.events import Event
from eva.notify import dead_letter_record
from eva.notify import to_cloudevent as composite_event
from eva.parser import parse

Output = tuple[str, str, dict[str, Any]]
"""(kind, profile, payload): kind "composite" (a composite CloudEvent) or "dead_letter"."""


class Composer(Protocol):
    """What the service composes through: profiles in, primitive notifications in,
    composites and dead letters out."""

    def register(self, text: str, at: int | None = None) -> list[str]:
        """Register a profile document; its profiles see events after ``at`` (default: the
        newest event fed so far; before any, the first event, as replay). Returns the profile
        names."""
        ...

    def remove(self, name: str) -> bool: ...

    def feed(self, events: Sequence[Event]) -> None: ...

    def collect(self) -> list[Output]:
        """What is ready: composites and dead letters since the last call."""
        ...

    def close(self) -> None: ...


class LiveComposer(Composer, Protocol):
    """A composer that reads a log itself (``SparkComposer`` given its ``lines``: the
    composer log, mediator/placement.py): started once its profiles are registered, it hands
    its output over as it goes."""

    def register_at(self, text: str, at: int | None, after: int = 0) -> list[str]:
        """Register a document whose profiles see the events after time ``at`` among the
        log's lines after position ``after``."""
        ...

    def begin(self) -> None:
        """Start (or resume from its checkpoint) on the profiles registered."""
        ...

    def committed(self) -> int | None:
        """The log position its latest micro-batch started after (None: none yet)."""
        ...

    def read_to(self) -> int | None:
        """The log position its latest micro-batch read up to (None: none yet)."""
        ...

    def failure(self) -> BaseException | None:
        """What stopped it, if it stopped by itself."""
        ...


class InProcessComposer:
    """The engine in this process: composites are ready as soon as ``feed`` returns."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self._out: list[Output] = []
        self._engine = Engine(config or EngineConfig(),
                              lambda d: self._out.append(("dead_letter", "", dead_letter_record(d))))
        self._newest: int | None = None

    def register(self, text: str, at: int | None = None) -> list[str]:
        start_at = at if at is not None else self._newest
        return self._engine.add_document(parse(text), start=start_at)

    def remove(self, name: str) -> bool:
        return self._engine.remove_profile(name)

    def feed(self, events: Sequence[Event]) -> None:
        for event in events:
            self._newest = max(self._newest or event.time, event.time)
            self._out.extend(("composite", n.profile, composite_event(n))
                             for n in self._engine.push(event))

    def collect(self) -> list[Output]:
        out, self._out = self._out, []
        return out

    def close(self) -> None:
        pass
