"""A subscription's notification log entry: the one place its format is written and read.

The pipeline appends each composite to its subscription's log (the store's notification log)
before it is sent; the stream that delivers it (mediator/delivery.py) and the MQTT sinks
(mediator/brokers.py) read it back. The payload is the ``Notification`` message's fields but the
resume token (which is the entry's position), as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson


@dataclass(frozen=True)
class Entry:
    """What a notification says of a composite: its CloudEvent, its profile and subscription,
    and of its constituents (in their order) each one's source, type and time, and the services
    they came through (each once)."""

    cloudevent: str
    profile: str
    subscription: str
    sources: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    services: list[str] = field(default_factory=list)


def encode(entry: Entry, ident: str) -> bytes:
    """The payload of ``entry`` for the composite ``ident``."""
    return orjson.dumps({"cloudevent": entry.cloudevent, "id": ident, "profile": entry.profile,
                         "subscription": entry.subscription, "sources": entry.sources,
                         "services": entry.services, "types": entry.types,
                         "times": entry.times})


def decode(payload: bytes) -> Entry:
    """The entry of a payload; ValueError for one that is not (written by another version)."""
    try:
        fields = orjson.loads(payload)
        return Entry(str(fields["cloudevent"]), str(fields.get("profile", "")),
                     str(fields.get("subscription", "")),
                     [str(s) for s in fields.get("sources", [])],
                     [str(t) for t in fields.get("types", [])],
                     [int(t) for t in fields.get("times", [])],
                     [str(s) for s in fields.get("services", [])])
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"not a notification log entry: {exc}") from None


__all__ = ["Entry", "decode", "encode"]
