"""Event model: CloudEvents 1.0 (JSON structured mode) in and out, integer-microsecond time.

The trace is totally ordered by ``(time, phase, seq)`` (DESIGN §3): primitive events come first in a
step (phase 0, in arrival order), then time events of time classes (phase 1), then passive events of
negations (phase 2), which must see every primitive event of their own instant.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

PRIMITIVE = 0
TIME_EVENT = 1
PASSIVE = 2

Key = tuple[int, int, Any]
"""Total-order key of an occurrence, the one ``Key`` of the algebra: (time in µs, phase, a
tiebreak within the phase) — an event's arrival order, a time class's position, a passive
event's anchor key."""


TICK_TYPE = "eva.tick."
"""The ``type`` of a time class's tick as an event (``eva.tick.<class>``): what a base service
sees of a time class, and how a dialect names it."""
TICK_SOURCE = "urn:evamed:clock"
"""The ``source`` of tick events."""


def tick_id(name: str, label: str) -> str:
    """The id of the tick of time class ``name`` at ``label`` (its time as RFC 3339): also the
    constituent a composite lists for it."""
    return f"tick:{name}@{label}"


def tick_event(name: str, time: int, label: str, seq: int = 0) -> Event:
    """The tick of time class ``name`` at ``time`` as an event (a base service's input)."""
    return Event(tick_id(name, label), TICK_SOURCE, TICK_TYPE + name, time, seq)


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
        head, rest = field_path(path)
        return self.field_at(head, rest)

    def field_at(self, head: str, rest: tuple[str, ...]) -> Any:
        """``field`` of a path split by :func:`field_path` (the engine splits a ``per`` path
        once, not per event)."""
        value: Any
        if head == "data":
            value = self.data
        elif head in ("id", "source", "type"):
            value = getattr(self, head)
        elif head == "time":
            value = self.time
        else:
            value = self.attributes.get(head)
        for part in rest:
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return value


def field_path(path: str) -> tuple[str, tuple[str, ...]]:
    """A dotted path as its head (an attribute, or ``data``) and the keys below it."""
    head, _, rest = path.partition(".")
    return head, tuple(rest.split(".")) if rest else ()


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An input the engine could not use, and why: ``malformed``, ``late``, ``future``,
    ``duplicate`` or ``state_cap``."""

    reason: str
    detail: str
    event: Event | None = None
    raw: str | None = None


# RFC 3339 §5.6 date-time, nothing else (CloudEvents' Timestamp): ASCII digits, 'T' or 't'
# between date and time, a fraction of one digit or more, 'Z'/'z' or a numeric offset.
_RFC3339 = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2})"
                      r"(?:\.([0-9]+))?(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))", re.ASCII)
_NO_OFFSET = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?",
                        re.ASCII)
# The common shape (a second, optional 3 or 6 fractional digits, Z): its second is looked up
# in a per-second cache that only the full parse fills, so only checked seconds are found.
_STAMP = re.compile(r"(.{19})(?:\.([0-9]{3}|[0-9]{6}))?Z", re.ASCII)
_SECONDS: dict[str, int] = {}  # "YYYY-MM-DDTHH:MM:SS" → µs: a stream repeats its seconds
_STAMPS: dict[int, str] = {}
_EPOCH_DAYS = 719_163  # date(1970, 1, 1).toordinal()
RFC3339 = "YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)"
MIN_TIME = -62_135_596_800_000_000
"""0001-01-01T00:00:00Z: the earliest time an event may carry (RFC 3339 years are 0001–9999
once in UTC; datetime has no year 0)."""
MAX_TIME = 253_402_300_799_999_999
"""9999-12-31T23:59:59.999999Z: the latest time an event may carry."""


def brief_repr(value: Any) -> str:
    """A value for a message: its repr, cut short (a message must not echo a megabyte)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_time(text: str) -> int:
    """RFC 3339 timestamp to integer microseconds since the epoch (UTC); anything else (other
    ISO 8601 forms, sub-microsecond digits that are not zero, times outside years 0001–9999 in
    UTC) raises :class:`EventError` naming what was found and what is expected."""
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
    m = _RFC3339.fullmatch(text)
    if m is None:
        if _NO_OFFSET.fullmatch(text):
            raise EventError(f"time {brief_repr(text)} has no UTC offset: expected {RFC3339}")
        raise EventError(f"time {brief_repr(text)} is not an RFC 3339 timestamp: "
                         f"expected {RFC3339}")
    date_time, fraction, sign, off_h, off_m = m.groups()
    if date_time.endswith("60"):
        raise EventError(f"time {brief_repr(text)} is a leap second, which time in microseconds "
                         "since the epoch (POSIX time) cannot represent: expected second ≤ 59")
    try:  # the shape is checked: what is left are the ranges (month 13, February 30, hour 24)
        stamp = datetime.fromisoformat(date_time[:10] + "T" + date_time[11:])
    except ValueError as exc:
        raise EventError(f"time {brief_repr(text)} is not a valid date and time: {exc}") from None
    seconds = ((stamp.toordinal() - _EPOCH_DAYS) * 86_400 + stamp.hour * 3600
               + stamp.minute * 60 + stamp.second)
    if sign is not None:
        if int(off_h) > 23 or int(off_m) > 59:
            raise EventError(f"time {brief_repr(text)} has UTC offset {sign}{off_h}:{off_m}: "
                             "expected hours ≤ 23 and minutes ≤ 59")
        seconds -= (int(off_h) * 60 + int(off_m)) * (60 if sign == "+" else -60)
    micros = seconds * 1_000_000
    if fraction is not None:
        if len(fraction) > 6 and fraction[6:].strip("0"):
            raise EventError(f"time {brief_repr(text)} has {len(fraction)} fractional digits; "
                             "time is kept in whole microseconds: expected at most 6 (or "
                             "zeros beyond them)")
        micros += int(fraction[:6].ljust(6, "0"))
    if not MIN_TIME <= micros <= MAX_TIME:
        raise EventError(f"time {brief_repr(text)} is outside 0001-01-01T00:00:00Z … "
                         "9999-12-31T23:59:59.999999Z once converted to UTC")
    return micros


def format_time(micros: int) -> str:
    """Integer microseconds to RFC 3339 UTC with a ``Z`` suffix (microsecond precision if needed).
    Total: a time outside years 0001–9999 (a clock tick before the first event minus a long
    lateness, say) is written with its proleptic Gregorian year, signed or wider than 4 digits,
    where datetime would raise."""
    seconds, frac = divmod(micros, 1_000_000)
    stamp = _STAMPS.get(seconds)
    if stamp is None:
        stamp = _civil(seconds)
        if len(_STAMPS) > 100_000:
            _STAMPS.clear()
        _STAMPS[seconds] = stamp
    return f"{stamp}.{frac:06d}Z" if frac else f"{stamp}Z"


def _civil(seconds: int) -> str:
    """Seconds since the epoch as ``YYYY-MM-DDTHH:MM:SS`` in the proleptic Gregorian calendar,
    any year (H. Hinnant's days-to-civil algorithm; datetime stops at years 1 and 9999, and
    strftime does not pad years below 1000)."""
    days, rest = divmod(seconds, 86_400)
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (1 if month <= 2 else 0)
    sign = "-" if year < 0 else ""
    return (f"{sign}{abs(year):04d}-{month:02d}-{day:02d}T{rest // 3600:02d}:"
            f"{rest // 60 % 60:02d}:{rest % 60:02d}")


REQUIRED = ("specversion", "id", "source", "type", "time")
MAX_DEPTH = 100
"""Deepest JSON nesting an event may have (the event object is level 1). Every encoder the
events go through (json, pickle for Spark) recurses, under Python's recursion limit of 1000."""


def from_cloudevent(obj: Any, seq: int = 0) -> Event:
    """Validate a structured-mode CloudEvent (already JSON-decoded) and convert it."""
    if not isinstance(obj, dict):
        raise EventError("event is not a JSON object")
    missing = [name for name in REQUIRED if name not in obj]
    if missing:
        raise EventError(f"missing required attribute(s): {', '.join(missing)}")
    if obj["specversion"] != "1.0":
        raise EventError(f"specversion {brief_repr(obj['specversion'])} is not 1.0")
    for name in ("id", "source", "type", "time"):
        if not isinstance(obj[name], str) or not obj[name]:
            raise EventError(f"attribute {name!r} must be a non-empty string")
    time = parse_time(obj["time"])
    attributes = {k: v for k, v in obj.items() if k not in ("id", "source", "type", "time", "data")}
    return Event(obj["id"], obj["source"], obj["type"], time, seq, obj.get("data"), attributes)


def from_json_line(line: str | bytes, seq: int = 0) -> Event:
    """One JSON line (text, or bytes that must be UTF-8) to an event; anything wrong with it
    raises :class:`EventError` with what was found and where — never another exception."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        obj = _slow_json(line)
    else:
        # orjson reads an integer outside [-2^63, 2^64) as the nearest float: two customers
        # 12345678901234567890123 and ...124 would be one. Such an integer is a run of 19
        # digits or more, and becomes a float that large; most lines have no such run and skip
        # the walk (translate and find: a tenth of a regular expression's time).
        raw = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
        if raw.translate(_DIGITS).find(_LONG_RUN) >= 0 and _has_big_float(obj):
            obj = _slow_json(line)
    # Deeper nesting needs more than 2 * MAX_DEPTH characters, and as many brackets: most
    # lines skip the walk.
    if len(line) > 2 * MAX_DEPTH and (
            line.count("{") + line.count("[") if isinstance(line, str)
            else line.count(b"{") + line.count(b"[")) > MAX_DEPTH and _too_deep(obj):
        raise EventError(f"JSON nested deeper than {MAX_DEPTH} levels")
    return from_cloudevent(obj, seq)


def _slow_json(line: str | bytes) -> Any:
    """What orjson refuses or gets wrong json may still take (NaN, integers beyond 64 bits,
    lone surrogates written as escapes); where both decode exactly, they agree. json's message
    is the one reported."""
    if isinstance(line, bytes):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EventError(f"not UTF-8: byte 0x{line[exc.start]:02x} at byte {exc.start + 1} "
                             f"({exc.reason})") from None
    else:
        text = line
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EventError(f"not JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise EventError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # the only other one: an integer beyond int's digit limit
        raise EventError(f"an integer of more than {sys.get_int_max_str_digits()} digits "
                         "(Python's limit for exact integers)") from None
    if isinstance(obj, dict):
        for name, value in obj.items():
            if _SURROGATE.search(name) or (
                    name != "data" and isinstance(value, str) and _SURROGATE.search(value)):
                # CloudEvents' String excludes unpaired surrogates: UTF-8 cannot carry them.
                raise EventError(f"attribute {brief_repr(name)} contains an unpaired surrogate "
                                 "(an escape in \\ud800-\\udfff); CloudEvents strings exclude "
                                 "them")
    return obj


_SURROGATE = re.compile(r"[\ud800-\udfff]")  # re reads the escapes: no surrogate in the source
_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))  # digits "0", the rest " "
_LONG_RUN = b"0" * 19
_EXACT_FLOATS = float(2**63)
"""orjson's integers are exact below 2^63 in magnitude (and up to 2^64 − 1): every integer it
turns into a float is at least this large."""


def _has_big_float(obj: Any) -> bool:
    """Whether ``obj`` holds a float of magnitude 2^63 or more (perhaps an integer orjson
    could not keep), without recursing (the depth is checked after)."""
    stack: list[Any] = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, float) and abs(value) >= _EXACT_FLOATS:
            return True
    return False


def _too_deep(obj: Any) -> bool:
    """Whether ``obj`` nests containers deeper than MAX_DEPTH, without recursing."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > MAX_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def to_cloudevent(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = {"specversion": "1.0", "id": event.id, "source": event.source,
                           "type": event.type, "time": format_time(event.time)}
    out.update({k: v for k, v in event.attributes.items() if k != "specversion"})
    if event.data is not None:
        out["data"] = event.data
    return out
