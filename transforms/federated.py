"""Federated planning: one profile over many services, each observing part of the events.

A service declares its group (a capability record) and its **coverage**: which events it
observes — patterns (``fnmatch``) over the CloudEvents ``source`` and ``type``. The planner
assigns each subtree of a profile to a service that covers all its primitive classes and can
evaluate it, and composes the rest at the mediator (docs/transformations.md, "Federated plans").
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from eva.events import Event
from transforms.capability import Capability


@dataclass(frozen=True)
class Coverage:
    """The events a service observes: an event whose source matches one of ``sources`` and
    whose type matches one of ``types`` (``fnmatch`` patterns; ``("*",)``: all)."""

    sources: tuple[str, ...] = ("*",)
    types: tuple[str, ...] = ("*",)

    def observes(self, event: Event) -> bool:
        return (any(fnmatchcase(event.source, p) for p in self.sources)
                and any(fnmatchcase(event.type, p) for p in self.types))


@dataclass(frozen=True)
class ServiceInfo:
    """A connected service as the planner sees it (``name`` is unique among them)."""

    name: str
    group: str
    capability: Capability
    coverage: Coverage = Coverage()


MEDIATOR = ""
"""The service name of a plan node evaluated at the mediator itself, on the events published
to it (``Publish``): what no connected service covers."""
