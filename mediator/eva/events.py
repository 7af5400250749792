"""Event model: CloudEvents 1.0 (JSON structured mode) in and out, integer-microsecond time.

The trace is totally ordered by ``(time, phase, seq)`` (DESIGN §3): primitive events come first in a
step (phase 0, in arrival order), then time events of time classes (phase 1), then passive events of
negations (phase 2), which must see every primitive event of their own instant.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

PRIMITIVE = 0
TIME_EVENT = 1
PASSIVE = 2

Key = tuple[int, int, int]
"""Total-order key of an occurrence: (time in µs, phase, sequence within the phase)."""


class EventError(ValueError):
    """A malformed event; the engine routes it to the dead-letter record with this message."""


@dataclass(frozen=True, slots=True)
class Event:
    """A primitive event: a CloudEvent reduced to what the algebra needs, plus the raw attributes."""

    id: str
    source: str
    type: str
    time: int
    seq: int = 0
    data: Any = None
    attributes: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> Key:
        return (self.time, PRIMITIVE, self.seq)

    @property
    def ident(self) -> str:
        # CloudEvents makes (source, id) unique; the id alone is what notifications list.
        return self.id

    def field(self, path: str) -> Any:
        """The value at a dotted path such as ``data.area`` or ``subject``; ``None`` when absent."""
        head, _, rest = path.partition(".")
        value: Any
        if head == "data":
            value = self.data
        elif head in ("id", "source", "type"):
            value = getattr(self, head)
        elif head == "time":
            value = self.time
        else:
            value = self.attributes.get(head)
        for part in rest.split(".") if rest else ():
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return value


_STAMP = re.compile(r"(.{19})(?:\.(\d{3}|\d{6}))?Z")
_SECONDS: dict[str, int] = {}  # "YYYY-MM-DDTHH:MM:SS" → µs: a stream repeats its seconds
_STAMPS: dict[int, str] = {}


def parse_time(text: str) -> int:
    """RFC 3339 timestamp to integer microseconds since the epoch (UTC)."""
    # The common shape (whole second, optional 3 or 6 fractional digits, Z) costs a lookup;
    # its second is checked the first time by the general parse below.
    shape = _STAMP.fullmatch(text)
    if shape is not None:
        second, fraction = shape.group(1), shape.group(2)
        base = _SECONDS.get(second)
        if base is None:
            try:
                base = _parse_time(second + "Z")
            except EventError:
                return _parse_time(text)  # reported with the text as given
            if len(_SECONDS) > 100_000:
                _SECONDS.clear()
            _SECONDS[second] = base
        if fraction is None:
            return base
        return base + int(fraction) * (1000 if len(fraction) == 3 else 1)
    return _parse_time(text)


def _parse_time(text: str) -> int:
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except (TypeError, ValueError) as exc:
        raise EventError(f"time {text!r} is not an RFC 3339 timestamp") from exc
    if stamp.tzinfo is None:
        raise EventError(f"time {text!r} has no UTC offset")
    delta = stamp - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def format_time(micros: int) -> str:
    """Integer microseconds to RFC 3339 UTC with a ``Z`` suffix (microsecond precision if needed)."""
    seconds, frac = divmod(micros, 1_000_000)
    stamp = _STAMPS.get(seconds)
    if stamp is None:
        stamp = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
        if len(_STAMPS) > 100_000:
            _STAMPS.clear()
        _STAMPS[seconds] = stamp
    return f"{stamp}.{frac:06d}Z" if frac else f"{stamp}Z"


REQUIRED = ("specversion", "id", "source", "type", "time")


def from_cloudevent(obj: Any, seq: int = 0) -> Event:
    """Validate a structured-mode CloudEvent (already JSON-decoded) and convert it."""
    if not isinstance(obj, dict):
        raise EventError("event is not a JSON object")
    missing = [name for name in REQUIRED if name not in obj]
    if missing:
        raise EventError(f"missing required attribute(s): {', '.join(missing)}")
    if obj["specversion"] != "1.0":
        raise EventError(f"specversion {obj['specversion']!r} is not 1.0")
    for name in ("id", "source", "type", "time"):
        if not isinstance(obj[name], str) or not obj[name]:
            raise EventError(f"attribute {name!r} must be a non-empty string")
    time = parse_time(obj["time"])
    attributes = {k: v for k, v in obj.items() if k not in ("id", "source", "type", "time", "data")}
    return Event(obj["id"], obj["source"], obj["type"], time, seq, obj.get("data"), attributes)


def from_json_line(line: str, seq: int = 0) -> Event:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        # What orjson refuses json may still take (NaN, integers beyond 64 bits, lone
        # surrogates); where both decode, they agree. json's message is the one reported.
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EventError(f"not JSON: {exc.msg} at column {exc.colno}") from exc
    return from_cloudevent(obj, seq)


def to_cloudevent(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = {"specversion": "1.0", "id": event.id, "source": event.source,
                           "type": event.type, "time": format_time(event.time)}
    out.update({k: v for k, v in event.attributes.items() if k != "specversion"})
    if event.data is not None:
        out["data"] = event.data
    return out
