"""Event model: CloudEvents 1.0 (JSON structured mode) in and out, integer-microsecond time.

The trace is totally ordered by ``(time, phase, seq)`` (DESIGN §3): primitive events come first in a
step (phase 0, in arrival order), then time events of time classes (phase 1), then passive events of
negations (phase 2), which must see every primitive event of their own instant.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, NoReturn

import orjson

from eva.envelope import DecodeError as _EnvelopeError
from eva.envelope import decode as _decode_envelope

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


def clock_id(ident: str) -> tuple[str, int] | None:
    """The (type, time) a constituent id of the clock names: a tick's (``tick:NAME@TIME``:
    its event type ``eva.tick.NAME``), an absence's (``absence@TIME``: ``"absence"``); None for
    any other id."""
    what, at, label = ident.rpartition("@")
    if not at or not (what == "absence" or what.startswith("tick:")):
        return None
    try:
        time = parse_time(label)
    except EventError:
        return None
    return (TICK_TYPE + what[5:] if what.startswith("tick:") else what), time


def tick_event(name: str, time: int, label: str, seq: int = 0) -> Event:
    """The tick of time class ``name`` at ``time`` as an event (a base service's input)."""
    return Event(tick_id(name, label), TICK_SOURCE, TICK_TYPE + name, time, seq)


class EventError(ValueError):
    """A malformed event; the engine routes it to the dead-letter record with this message."""


class Event:
    """A primitive event: a CloudEvent reduced to what the algebra needs, plus the raw attributes.

    A value, as the frozen dataclass it was: compared and hashed by ``(id, source, type, time,
    seq, data)`` (not by ``attributes``), never changed once made. Written by hand rather than
    as a dataclass for one reason: ``data`` may be kept as JSON text and parsed when first read
    (:func:`from_fields`), which a dataclass field cannot do."""

    __slots__ = ("_data", "_raw", "attributes", "id", "seq", "source", "time", "type")

    _fields: ClassVar[tuple[str, ...]] = (
        "id", "source", "type", "time", "seq", "data", "attributes")
    """The constructor's parameters, as a named tuple lists its fields: eva/snapshot.py writes
    an event as these values (``data`` parsed) and rebuilds it by calling the class."""

    def __init__(self, id: str, source: str, type: str, time: int, seq: int = 0,
                 data: Any = None, attributes: dict[str, Any] | None = None) -> None:
        self.id = id
        self.source = source
        self.type = type
        self.time = time
        self.seq = seq
        self._data: Any = data
        self._raw: str | bytes | None = None  # data's JSON text while it is not parsed
        self.attributes: dict[str, Any] = {} if attributes is None else attributes

    @property
    def data(self) -> Any:
        """The ``data`` member, parsed on first read when the event was made from its text."""
        raw = self._raw
        if raw is not None:
            self._data = _data_of(raw)
            self._raw = None
        return self._data

    def renumbered(self, seq: int) -> Event:
        """The same event with arrival number ``seq`` (its data still unparsed if it was)."""
        event = Event(self.id, self.source, self.type, self.time, seq, self._data,
                      self.attributes)
        event._raw = self._raw
        return event

    def _values(self) -> tuple[Any, ...]:
        return (self.id, self.source, self.type, self.time, self.seq, self.data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())  # a TypeError for dict data, as the dataclass's was

    def __repr__(self) -> str:
        return (f"Event(id={self.id!r}, source={self.source!r}, type={self.type!r}, "
                f"time={self.time!r}, seq={self.seq!r}, data={self.data!r}, "
                f"attributes={self.attributes!r})")

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (Spark) as its constructor's arguments, data parsed.
        return (Event, (self.id, self.source, self.type, self.time, self.seq, self.data,
                        self.attributes))

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
        elif head == "id":
            value = self.id
        elif head == "source":
            value = self.source
        elif head == "type":
            value = self.type
        elif head == "time":
            value = self.time
        else:
            value = self.attributes.get(head)
        for part in rest:
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return value


def from_fields(id: str, source: str, type: str, time: int, seq: int = 0,
                data: str | bytes | None = None,
                attributes: dict[str, Any] | None = None) -> Event:
    """An event whose envelope was parsed elsewhere (Spark's ``from_json``, a batch reader):
    ``data`` is the raw JSON text of the data member (None: absent), parsed only when something
    reads ``event.data`` (a predicate on ``data.…``, a ``per`` key, a snapshot, an output).
    The caller has validated the envelope (non-empty strings; ``time`` in µs from an RFC 3339
    text) and gives the data member's JSON text as it stood in a line that parsed.

    Reading never raises (it runs inside a predicate): the text is read with a line's rules
    (orjson; json for what orjson refuses or rounds — NaN, integers past 64 bits) and, if it
    still does not parse or nests deeper than a line's data may (``MAX_DEPTH`` − 1), ``data``
    reads as the text itself, a JSON string: nothing lost, nothing raised, and visible in every
    output. (A JSON string value must therefore come quoted: ``"abc"`` is the string abc; the
    bare text abc, which is not JSON, also reads as abc.)"""
    event = Event(id, source, type, time, seq, None, attributes)
    event._raw = data
    return event


def _data_of(raw: str | bytes) -> Any:
    """A data member's JSON text, parsed (:func:`from_fields`); the text itself if it is not
    JSON a line could carry."""
    try:
        return _json_value(raw, MAX_DEPTH - 1)
    except EventError:
        return raw if isinstance(raw, str) else raw.decode("utf-8", "backslashreplace")


def field_path(path: str) -> tuple[str, tuple[str, ...]]:
    """A dotted path as its head (an attribute, or ``data``) and the keys below it."""
    head, _, rest = path.partition(".")
    return head, tuple(rest.split(".")) if rest else ()


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An input the engine could not use, and why: ``malformed``, ``late``, ``future``,
    ``duplicate``, ``state_cap`` or ``composite_limit``."""

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
# The common shape (YYYY-MM-DDTHH:MM:SS, optional 3 or 6 fractional digits, Z) is read through a
# per-minute cache that only the full parse fills, so only checked minutes are found: a stream
# repeats its minutes (at one event per second a per-second cache would never hit), and any
# second 00–59 of a valid minute is valid. Both caches are cleared when full (memory stays flat).
_MINUTES: dict[str, int] = {}  # "YYYY-MM-DDTHH:MM" → µs
_LAST_MINUTE: tuple[str, int] = ("\0" * 17, 0)
"""The last minute :func:`parse_time` read and its µs (at first 17 characters no time it reads
the short way starts with: its 17th is a colon)."""
_STAMPS: dict[int, str] = {}  # minutes since the epoch → "YYYY-MM-DDTHH:MM:"
_CACHED = 4096
_SECOND_TEXT = [f"{s:02d}" for s in range(60)]
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
    global _LAST_MINUTE
    n = len(text)
    if (n == 20 or n == 24 or n == 27) and text[n - 1] == "Z" and text[16] == ":":
        # The minute of the previous call first: consecutive events mostly share it, and a
        # prefix comparison makes no string. (One tuple, replaced whole: threads share it.)
        last = _LAST_MINUTE
        if text.startswith(last[0]):
            base = last[1]
        else:
            minute = text[:16]
            found = _MINUTES.get(minute)
            if found is None:
                try:
                    found = _parse_time(minute + ":00Z")
                except EventError:
                    return _parse_time(text)  # reported with the text as given
                if len(_MINUTES) >= _CACHED:
                    _MINUTES.clear()
                _MINUTES[minute] = found
            base = found
            _LAST_MINUTE = (minute, base)
        tens = ord(text[17]) - 48
        units = ord(text[18]) - 48
        if 0 <= tens <= 5 and 0 <= units <= 9:
            base += (tens * 10 + units) * 1_000_000
            if n == 20:
                return base
            fraction = text[20:n - 1]
            if text[19] == "." and fraction.isascii() and fraction.isdigit():
                return base + int(fraction) * (1000 if n == 24 else 1)
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
    minutes, second = divmod(seconds, 60)
    stamp = _STAMPS.get(minutes)
    if stamp is None:
        stamp = _civil(minutes * 60)[:-2]
        if len(_STAMPS) >= _CACHED:
            _STAMPS.clear()
        _STAMPS[minutes] = stamp
    if frac:
        return f"{stamp}{_SECOND_TEXT[second]}.{frac:06d}Z"
    return stamp + _SECOND_TEXT[second] + "Z"


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
    attributes = dict(obj)  # what is left once the event's own fields are taken out
    ident = attributes.pop("id", None)
    source = attributes.pop("source", None)
    kind = attributes.pop("type", None)
    time = attributes.pop("time", None)
    data = attributes.pop("data", None)
    if not (isinstance(ident, str) and ident and isinstance(source, str) and source
            and isinstance(kind, str) and kind and isinstance(time, str) and time
            and attributes.get("specversion") == "1.0"):
        _refuse(obj)
    return Event(ident, source, kind, parse_time(time), seq, data, attributes)


def _refuse(obj: dict[str, Any]) -> NoReturn:
    """Raise what is wrong with a CloudEvent's required attributes, the first thing first."""
    missing = [name for name in REQUIRED if name not in obj]
    if missing:
        raise EventError(f"missing required attribute(s): {', '.join(missing)}")
    if obj["specversion"] != "1.0":
        raise EventError(f"specversion {brief_repr(obj['specversion'])} is not 1.0")
    for name in ("id", "source", "type", "time"):
        if not isinstance(obj[name], str) or not obj[name]:
            raise EventError(f"attribute {name!r} must be a non-empty string")
    raise AssertionError("_refuse of a valid envelope")


def from_json_line(line: str | bytes, seq: int = 0) -> Event:
    """One JSON line (text, or bytes that must be UTF-8) to an event; anything wrong with it
    raises :class:`EventError` with what was found and where — never another exception."""
    return from_cloudevent(_json_value(line, MAX_DEPTH), seq)


def read_lines(lines: list[tuple[int, bytes]]) -> list[Event | EventError]:
    """A batch of numbered JSON lines (``common.event_lines``) as events numbered by their
    line, or the error of each line that is not one — :func:`from_json_line` of each, in one
    loop (compiled with the engine, the loop costs no interpreted call per line)."""
    out: list[Event | EventError] = []
    for number, line in lines:
        try:
            event = _enveloped(line, number)
            out.append(event if event is not None
                       else from_cloudevent(_json_value(line, MAX_DEPTH), number))
        except EventError as exc:
            out.append(exc)
    return out


def read_texts(lines: list[str]) -> list[Event | EventError]:
    """JSON lines as text (the door's batch) as events numbered 0, or the error of each line
    that is not one — :func:`from_json_line` of each, in one compiled loop."""
    out: list[Event | EventError] = []
    for line in lines:
        try:
            event = _enveloped(line, 0)
            out.append(event if event is not None
                       else from_cloudevent(_json_value(line, MAX_DEPTH), 0))
        except EventError as exc:
            out.append(exc)
    return out


_ENVELOPED: dict[str, Any] = {"specversion": "1.0"}
"""The attributes of every event :func:`_enveloped` reads: one dictionary for all of them (an
event is never changed once made, and ``renumbered`` shares its dictionary the same way)."""


def _enveloped(line: str | bytes, seq: int) -> Event | None:
    """The event of a line with the common envelope (eva/envelope.py: the required attributes
    and ``data``, nothing else), its ``data`` kept as text and parsed when first read
    (:func:`from_fields`); None for any other line, which the general path reads. The same
    event, or the same error, as that path (tests/test_envelope.py), in a third of the time:
    no dictionary is built for the line, nor for ``data`` until something reads it.

    The lines it leaves to the general path are those where reading ``data`` later could
    differ from reading it now: not ASCII (msgspec checks the JSON of ``data`` but not that
    its strings are UTF-8), possibly nested too deep (many brackets), or holding a run of 19
    digits (an integer orjson cannot keep, or one past Python's digit limit)."""
    if not line.isascii() or _may_nest_deeper(line, MAX_DEPTH):
        return None
    try:
        envelope = _decode_envelope(line)
    except _EnvelopeError:
        return None
    data = bytes(envelope.data)
    if _long_digit_run(data):
        return None
    event = Event(envelope.id, envelope.source, envelope.type, parse_time(envelope.time), seq,
                  None, _ENVELOPED)
    if data and data != b"null":
        event._raw = data
    return event


def _json_value(line: str | bytes, depth: int) -> Any:
    """JSON text (a line, or a data member's text) as Python values, nested at most ``depth``
    levels; anything wrong raises :class:`EventError` with what was found and where."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        obj = _slow_json(line)
    else:
        # orjson reads an integer outside [-2^63, 2^64) as the nearest float: two customers
        # 12345678901234567890123 and ...124 would be one. Such an integer is a run of 19
        # digits or more, and becomes a float that large; most lines have no such run and skip
        # the walk.
        raw = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
        if _long_digit_run(raw) and _has_big_float(obj):
            obj = _slow_json(line)
    if _may_nest_deeper(line, depth) and _too_deep(obj, depth):
        raise EventError(f"JSON nested deeper than {MAX_DEPTH} levels")
    return obj


def _may_nest_deeper(line: str | bytes, depth: int) -> bool:
    """Whether JSON ``line`` may nest deeper than ``depth``: that needs more than ``2 * depth``
    characters, and as many brackets — most lines skip the walk."""
    return len(line) > 2 * depth and (
        line.count("{") + line.count("[") if isinstance(line, str)
        else line.count(b"{") + line.count(b"[")) > depth


def _long_digit_run(raw: bytes) -> bool:
    """Whether ``raw`` holds a run of 19 digits or more: an integer orjson may not keep
    (translate and find: a tenth of a regular expression's time)."""
    return len(raw) >= 19 and raw.translate(_DIGITS).find(_LONG_RUN) >= 0


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


def _too_deep(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests containers deeper than ``limit``, without recursing."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
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
