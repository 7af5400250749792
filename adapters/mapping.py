"""A broker's messages as CloudEvents: the mapping of an MQTT source (docs/sources.md).

A mapping is a list of **rules**, tried in order; the first whose topic pattern matches a
message's topic maps it. A pattern is an MQTT topic filter whose wildcards may be named —
``plant/+line/+sensor/#rest`` — and the captures fill the templates of the event's ``type``,
``source`` and ``subject`` (``{sensor}``, or ``{1}`` for the first wildcard; ``{topic}`` is the
whole topic, ``{broker}`` the source's name). The payload becomes ``data`` (JSON) or
``data_base64`` (anything else, unless the rule dead-letters it); the time comes from a payload
field in a stated format or is stamped on arrival; the id comes from a payload field or is
derived (:func:`derived_id`). The message's topic travels as the extension attribute ``topic``.

Going the other way, :meth:`Mapping.select` turns a CG-0 native query (``[type = "…" & …]``)
into the topic filters a broker can apply: a ``type``, ``source``, ``subject`` or ``topic``
the query pins is mapped back through each rule's templates into its pattern's wildcards; what
cannot be mapped back leaves the rule's whole pattern, and the mediator filters the rest (it
evaluates the whole query on what the broker sends). :func:`disjoint` makes the filters of all
queries pairwise disjoint, so that a broker never sends one message twice for two overlapping
subscriptions (whose copies would carry different packet ids, and so different derived ids).

Everything here is pure: a message (:class:`Packet`) maps to a :class:`Mapped` event, a
:class:`SourceDeadLetter` (with the topic and the reason), or None (no rule's topic), never an
exception.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterable, Sequence
from collections.abc import Mapping as MappingType
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from eva import ast
from eva.admission import Reason
from eva.classes import required_values
from eva.events import (
    MAX_TIME,
    MIN_TIME,
    TICK_TYPE,
    Event,
    EventError,
    brief_repr,
    format_time,
    from_json_line,
    parse_time,
)
from transforms.federated import Coverage

TOPIC_ATTRIBUTE = "topic"
"""The CloudEvents extension attribute carrying the MQTT topic a message came on (a class can
name it: ``topic == "plant/a/temp"`` becomes that exact topic filter at the broker)."""
TIME_FORMATS = ("rfc3339", "epoch_s", "epoch_ms", "epoch_us")
_PER_UNIT = {"epoch_s": 1_000_000, "epoch_ms": 1_000, "epoch_us": 1}
NON_JSON = ("base64", "dead-letter")
RETAINED = ("ignore", "accept")
MAX_SOLUTIONS = 64
"""Ways a pinned value may be read back through a template before the rule's whole pattern is
subscribed instead (a template with several captures may split a value many ways)."""
MAX_STEPS = 10_000
"""Steps of that search (a long value split among several captures) before it gives up the
same way."""
PREVIEW = 200
"""Payload bytes a dead letter's log line shows."""
KEPT = 1 << 20
"""Payload bytes a dead letter keeps (the dead-letter log keeps at most its own bound)."""

TimeFormat = Literal["rfc3339", "epoch_s", "epoch_ms", "epoch_us"]


class MappingConfigError(ValueError):
    """A mapping that cannot be used: which rule, which field, what was found and expected."""


# ------------------------------------------------------------------ topic patterns


@dataclass(frozen=True)
class Wild:
    """A wildcard level of a pattern: ``+`` (one level) or ``#`` (the rest), maybe named."""

    kind: str    # "+" or "#"
    index: int   # 0-based among the pattern's wildcards ({1} in a template is index 0)
    name: str = ""


Level = str | Wild
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Pattern:
    """A topic pattern: MQTT filter levels, a wildcard optionally followed by a capture name."""

    text: str
    levels: tuple[Level, ...]

    @property
    def broker_filter(self) -> str:
        """The MQTT topic filter (the names dropped)."""
        return "/".join(lv.kind if isinstance(lv, Wild) else lv for lv in self.levels)

    @property
    def wilds(self) -> tuple[Wild, ...]:
        return tuple(lv for lv in self.levels if isinstance(lv, Wild))

    def match(self, topic: str) -> dict[int, str] | None:
        """The captures (by wildcard index) if ``topic`` matches, else None. As a broker
        matches: a wildcard first level does not match a ``$`` topic; ``a/#`` matches ``a``."""
        parts = topic.split("/")
        if topic.startswith("$") and isinstance(self.levels[0], Wild):
            return None
        captures: dict[int, str] = {}
        for i, level in enumerate(self.levels):
            if isinstance(level, Wild) and level.kind == "#":
                captures[level.index] = "/".join(parts[i:])
                return captures
            if i >= len(parts):
                return None
            if isinstance(level, Wild):
                captures[level.index] = parts[i]
            elif level != parts[i]:
                return None
        return captures if len(parts) == len(self.levels) else None

    def filters(self, assigned: MappingType[int, str]) -> list[str]:
        """The topic filters selecting what matches with the ``assigned`` captures (the other
        wildcards stay). A ``#`` assigned "" selects the parent topic and its empty child."""
        out: list[str] = []
        for level in self.levels:
            if not isinstance(level, Wild) or level.index not in assigned:
                out.append(level.kind if isinstance(level, Wild) else level)
                continue
            value = assigned[level.index]
            if level.kind == "#" and value == "":
                prefix = "/".join(out)
                return [prefix, prefix + "/"] if out else []
            out.append(value)
        return ["/".join(out)]


def parse_pattern(text: object) -> Pattern:
    """``plant/+line/+sensor/#rest`` → a :class:`Pattern`; MappingConfigError says what is
    wrong (a wildcard inside a level, ``#`` not last, a capture name used twice)."""
    if not isinstance(text, str) or not text:
        raise MappingConfigError(f"found topic {brief_repr(text)}, expected an MQTT topic filter "
                                 "such as 'plant/+line/+sensor' (wildcards may be named)")
    levels: list[Level] = []
    names: set[str] = set()
    parts = text.split("/")
    for i, part in enumerate(parts):
        kind, name = part[:1], part[1:]
        if kind in ("+", "#"):
            if name and not _NAME.fullmatch(name):
                raise MappingConfigError(f"topic {text!r}, level {i + 1} {part!r}: a wildcard "
                                         "is '+' or '#', alone or followed by a capture name "
                                         "(letters, digits, '_')")
            if kind == "#" and i != len(parts) - 1:
                raise MappingConfigError(f"topic {text!r}: '#' must be the last level, found it "
                                         f"at level {i + 1} of {len(parts)}")
            if name in names:
                raise MappingConfigError(f"topic {text!r}: the capture name {name!r} is used twice")
            if name:
                names.add(name)
            levels.append(Wild(kind, sum(isinstance(lv, Wild) for lv in levels), name))
        elif "+" in part or "#" in part or "\0" in part:
            raise MappingConfigError(f"topic {text!r}, level {i + 1} {part!r}: '+' and '#' must "
                                     "stand at the start of a level (and NUL nowhere)")
        else:
            levels.append(part)
    return Pattern(text, tuple(levels))


# ------------------------------------------------------------------ templates

TOPIC = -1
"""The reference ``{topic}`` (the whole topic) among a template's wildcard indices."""


@dataclass(frozen=True)
class Template:
    """An attribute's template: literal text and references to captures (by wildcard index)
    or to the whole topic (:data:`TOPIC`); ``{broker}`` is resolved when it is parsed."""

    text: str
    parts: tuple[str | int, ...]

    def render(self, topic: str, captures: MappingType[int, str]) -> str:
        return "".join(p if isinstance(p, str) else topic if p == TOPIC else captures[p]
                       for p in self.parts)

    def glob(self) -> str:
        """An ``fnmatch`` pattern matching every value the template can render (coverage)."""
        out = []
        for p in self.parts:
            if isinstance(p, str):
                out.append("".join(f"[{c}]" if c in "*?[" else c for c in p))
            elif not out or out[-1] != "*":
                out.append("*")
        return "".join(out)

    def invert(self, value: str, kinds: MappingType[int, str]) -> list[dict[int, str]] | None:
        """Every assignment of the references that renders ``value`` (``kinds``: each wildcard's
        ``+``/``#``, which bounds what it can hold), or None when there are more than
        :data:`MAX_SOLUTIONS`."""
        out: list[dict[int, str]] = []
        budget = [MAX_STEPS]

        def fits(ref: int, text: str) -> bool:
            if "+" in text or "#" in text or "\0" in text:
                return False
            return ref == TOPIC or kinds[ref] == "#" or "/" not in text

        def walk(i: int, pos: int, bound: dict[int, str]) -> bool:
            budget[0] -= 1
            if len(out) > MAX_SOLUTIONS or budget[0] < 0:
                return False
            if i == len(self.parts):
                if pos == len(value):
                    out.append(dict(bound))
                return True
            part = self.parts[i]
            if isinstance(part, str):
                return walk(i + 1, pos + len(part), bound) if value.startswith(part, pos) else True
            if part in bound:
                known = bound[part]
                return walk(i + 1, pos + len(known), bound) if value.startswith(known, pos) else True
            for end in range(pos, len(value) + 1):
                piece = value[pos:end]
                if not fits(part, piece):
                    break  # what makes it unfit, a longer piece holds too
                bound[part] = piece
                going = walk(i + 1, end, bound)
                del bound[part]
                if not going:
                    return False
            return True

        walk(0, 0, {})
        return None if len(out) > MAX_SOLUTIONS or budget[0] < 0 else out


def parse_template(text: object, what: str, pattern: Pattern, broker: str) -> Template:
    """``"plant.{sensor}.reading"`` over ``pattern``'s captures; ``{{``/``}}`` are braces."""
    if not isinstance(text, str):
        raise MappingConfigError(f"{what}: found {brief_repr(text)}, expected a template string "
                                 "such as 'plant.{sensor}'")
    names = {w.name: w.index for w in pattern.wilds if w.name}
    parts: list[str | int] = []
    literal: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c in "{}" and text[i + 1:i + 2] == c:
            literal.append(c)
            i += 2
            continue
        if c == "}":
            raise MappingConfigError(f"{what} {text!r}, character {i + 1}: a lone '}}' (write "
                                     "'}}}}' for a brace)")
        if c != "{":
            literal.append(c)
            i += 1
            continue
        end = text.find("}", i)
        if end < 0:
            raise MappingConfigError(f"{what} {text!r}, character {i + 1}: '{{' is not closed")
        ref = text[i + 1:end]
        if ref == "broker":
            literal.append(broker)
        else:
            if literal:
                parts.append("".join(literal))
                literal = []
            if ref == "topic":
                parts.append(TOPIC)
            elif ref.isdigit() and 1 <= int(ref) <= len(pattern.wilds):
                parts.append(int(ref) - 1)
            elif ref in names:
                parts.append(names[ref])
            else:
                known = [f"{{{n}}}" for n in names] + [
                    f"{{{k + 1}}}" for k in range(len(pattern.wilds))] + ["{topic}", "{broker}"]
                raise MappingConfigError(f"{what} {text!r}: unknown reference {{{ref}}}; "
                                         f"topic {pattern.text!r} offers {', '.join(known)}")
        i = end + 1
    if literal:
        parts.append("".join(literal))
    return Template(text, tuple(parts))


# ------------------------------------------------------------------ rules and messages


@dataclass(frozen=True)
class Rule:
    """One topic pattern and how its messages become events."""

    pattern: Pattern
    type: Template
    source: Template
    subject: Template | None = None
    time_field: str = ""            # "": stamped on arrival
    time_format: TimeFormat = "rfc3339"
    id_field: str = ""              # "": derived (:func:`derived_id`)
    non_json: str = "base64"        # or "dead-letter"
    retained: str = "ignore"        # or "accept"

    def templates(self) -> dict[str, Template]:
        out = {"type": self.type, "source": self.source}
        if self.subject is not None:
            out["subject"] = self.subject
        return out


@dataclass(frozen=True)
class Packet:
    """A message as the broker delivered it. ``topic`` is bytes when it is not UTF-8."""

    topic: str | bytes
    payload: bytes
    qos: int = 1
    mid: int = 0          # the packet identifier (QoS ≥ 1; 0 for QoS 0)
    retain: bool = False  # a retained message sent on subscribing
    arrival_us: int = 0   # when it arrived (the event time of a rule without a time field)
    seq: int = 0          # arrival order in this process (a QoS 0 id's tiebreak)
    ident: str = ""       # an id the transport gives, the same on every redelivery (a Redis
                          # stream entry's): the event id when the rule names no id field


@dataclass(frozen=True)
class Mapped:
    line: str    # the CloudEvent, one JSON line (what the event log stores)
    event: Event


@dataclass(frozen=True)
class SourceDeadLetter:
    """A message the mapping could not turn into an event: the dead-letter record."""

    broker: str
    topic: str
    reason: str   # an eva.admission.Reason: topic, payload, time, id, attribute, malformed,
    detail: str   # too_large, deleted (Redis)
    payload: bytes = b""  # the first KEPT bytes
    size: int = -1        # the payload's whole size (-1: len(payload))
    kind: str = "payload"  # what payload is: a broker's payload, or a "cloudevent" line

    def record(self) -> dict[str, Any]:
        """As JSON (for a log line): the payload's first PREVIEW bytes."""
        return {"broker": self.broker, "topic": self.topic, "reason": str(self.reason),
                "detail": self.detail,
                "payload": self.payload[:PREVIEW].decode("utf-8", "replace")}

    def __str__(self) -> str:
        return f"{self.broker}: topic {self.topic!r}: {self.reason}: {self.detail}"


def derived_id(broker: str, packet: Packet, topic: str) -> str:
    """The event id of a message whose payload names none: the same for a QoS-1 redelivery.

    A redelivery (after a reconnect, MQTT's only kind) carries the message's original packet
    identifier, topic and payload; so the id hashes the broker, topic and payload and appends
    the packet id. Packet ids are reused (16 bits, per session, once acknowledged), so two
    *different* messages with the same topic and the same payload bytes that get the same packet
    id read as one (the second dropped as a duplicate while the first is in the mediator's
    duplicate memory): a payload that carries a time or a sequence number never collides. A
    retained message (sent again on each subscribe, each time under a new packet id) is
    identified by topic and payload alone; a QoS-0 message is never redelivered, so its id takes
    its arrival instead. What this cannot tell apart: a publisher's own QoS-1 retry (it reaches
    the broker twice, and is sent on as two messages with two packet ids) — name an id field
    to drop those too. A broker that names each message for good (``packet.ident``: a Redis
    stream's entry id) needs none of this: that name is the id."""
    if packet.ident:
        return packet.ident
    if packet.retain:
        key = b"retained"
    elif packet.qos == 0:
        key = f"t{packet.arrival_us}.{packet.seq}".encode()
    else:
        key = f"m{packet.mid}".encode()
    digest = hashlib.blake2b(digest_size=12)
    for part in (broker.encode("utf-8", "surrogatepass"), topic.encode("utf-8", "surrogatepass"),
                 packet.payload):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return f"mqtt-{digest.hexdigest()}-{key.decode()}"


class _Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def _load_json(payload: bytes) -> Any:
    """The payload as strict JSON (no NaN), integers kept exact; ValueError if it is not."""
    value = orjson.loads(payload)
    if _LONG_DIGITS.search(payload):  # orjson rounds an integer beyond 64 bits to a float
        value = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _dumps(obj: dict[str, Any]) -> str:
    try:
        return orjson.dumps(obj).decode()
    except (TypeError, orjson.JSONEncodeError):  # an integer beyond 64 bits, a lone surrogate
        return json.dumps(obj, separators=(",", ":"))


def _field(value: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _time(value: Any, rule: Rule) -> int:
    """A payload time field's value in microseconds, in the rule's format."""
    where = f"payload field {rule.time_field!r}"
    if value is None:
        raise _Refused(Reason.TIME, f"{where} is missing (the rule takes the event time from it)")
    if rule.time_format == "rfc3339":
        if not isinstance(value, str):
            raise _Refused(Reason.TIME, f"{where} is {brief_repr(value)}, expected an RFC 3339 string")
        try:
            return parse_time(value)
        except EventError as exc:
            raise _Refused(Reason.TIME, f"{where}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise _Refused(Reason.TIME, f"{where} is {brief_repr(value)}, expected a number "
                       f"({rule.time_format.replace('_', ' ')})")
    unit = _PER_UNIT[rule.time_format]
    try:
        micros = value * unit if isinstance(value, int) else round(value * unit)
    except OverflowError:
        micros = MAX_TIME + 1
    if not MIN_TIME <= micros <= MAX_TIME:
        raise _Refused(Reason.TIME, f"{where} is {brief_repr(value)} ({rule.time_format}), outside "
                       f"{format_time(MIN_TIME)} … {format_time(MAX_TIME)}")
    return int(micros)


def _ident(value: Any, rule: Rule) -> str:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    found = "missing" if value is None else brief_repr(value)
    raise _Refused(Reason.ID, f"payload field {rule.id_field!r} is {found}, expected a non-empty "
                   "string or an integer (the rule takes the event id from it)")


# ------------------------------------------------------------------ the mapping


@dataclass(frozen=True)
class Selection:
    """What a broker is asked for one query: its topic filters, and how they were found."""

    filters: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Mapping:
    """A broker's rules (``broker``: the source's name, ``{broker}`` in a template)."""

    broker: str
    rules: tuple[Rule, ...]

    # -- messages → events

    def map(self, packet: Packet) -> Mapped | SourceDeadLetter | None:
        """The event of ``packet``, its dead letter, or None: no rule's pattern matches its topic
        (a broker filter wider than the rules, or a retained message a rule ignores)."""
        try:
            topic = (packet.topic if isinstance(packet.topic, str)
                     else packet.topic.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return self._dead(repr(packet.topic)[2:-1], packet, Reason.TOPIC, "the topic is not "
                              f"UTF-8 (byte {exc.start + 1}); MQTT topics are UTF-8 text")
        for rule in self.rules:
            captures = rule.pattern.match(topic)
            if captures is None:
                continue
            if packet.retain and rule.retained == "ignore":
                return None
            try:
                return self._event(rule, topic, captures, packet)
            except _Refused as refused:
                return self._dead(topic, packet, refused.reason, refused.detail)
            except Exception as exc:  # whatever the payload holds, one dead letter, never a crash
                return self._dead(topic, packet, Reason.MALFORMED, f"could not be mapped "
                                  f"({type(exc).__name__}: {str(exc)[:200]})")
        return None

    def _dead(self, topic: str, packet: Packet, reason: str, detail: str) -> SourceDeadLetter:
        return SourceDeadLetter(self.broker, topic, reason, detail, packet.payload[:KEPT],
                                len(packet.payload))

    def _event(self, rule: Rule, topic: str, captures: dict[int, str], packet: Packet) -> Mapped:
        obj: dict[str, Any] = {"specversion": "1.0"}
        for name, template in rule.templates().items():
            value = template.render(topic, captures)
            if not value:
                raise _Refused(Reason.ATTRIBUTE, f"{name} template {template.text!r} renders empty "
                               "for this topic (a CloudEvents attribute must not be empty)")
            obj[name] = value
        payload: Any = None
        is_json = True
        try:
            payload = _load_json(packet.payload)
        except (ValueError, UnicodeDecodeError, RecursionError):
            is_json = False
            if rule.non_json == "dead-letter":
                raise _Refused(Reason.PAYLOAD, f"the payload ({len(packet.payload)} bytes) is not "
                               "JSON, and the rule dead-letters what is not") from None
        if (rule.time_field or rule.id_field) and not isinstance(payload, dict):
            raise _Refused(Reason.TIME if rule.time_field else Reason.ID, "the payload is "
                           f"{'a JSON ' + type(payload).__name__ if is_json else 'not JSON'}; "
                           "the rule reads fields of a JSON object")
        time = _time(_field(payload, rule.time_field), rule) if rule.time_field else packet.arrival_us
        obj["id"] = (_ident(_field(payload, rule.id_field), rule) if rule.id_field
                     else derived_id(self.broker, packet, topic))
        obj["time"] = format_time(time)
        obj[TOPIC_ATTRIBUTE] = topic
        if is_json:
            obj["datacontenttype"] = "application/json"
            obj["data"] = payload
        else:
            obj["datacontenttype"] = "application/octet-stream"
            obj["data_base64"] = base64.b64encode(packet.payload).decode()
        line = _dumps(obj)
        try:
            event = from_json_line(line)
        except EventError as exc:
            raise _Refused(Reason.MALFORMED, f"the event is refused: {exc}") from None
        return Mapped(line, event)

    # -- what the broker observes

    def sources(self) -> tuple[str, ...]:
        """``fnmatch`` patterns matching every source the rules can produce."""
        return tuple(dict.fromkeys(r.source.glob() for r in self.rules))

    def coverage(self) -> Coverage:
        """What the source's link observes: every type the rules can produce (``fnmatch``
        patterns), from **any** source. The link evaluates at the mediator, on the event log,
        and is given every logged event of those types — whichever way it came in — so that is
        what it observes; and a class that names its type but not its source (the usual
        ``type == "plant.temp.reading"``) is covered, so the planner gives it to the link and the
        broker is asked for its messages. (Had the coverage listed :meth:`sources`, only a class
        pinning the source would be, and no broker would be asked for the others.)"""
        return Coverage(("*",), tuple(dict.fromkeys(r.type.glob() for r in self.rules)))

    # -- queries → topic filters

    def select(self, query: ast.Predicate | None) -> Selection:
        """The topic filters selecting every message whose event can match ``query`` (a CG-0
        filter's predicate; None: every message): each rule's pattern, narrowed by the
        ``type``, ``source``, ``subject`` and ``topic`` values the query pins, read back through
        the rule's templates. The filters may select more than the query matches — never less;
        the mediator evaluates the whole query on what arrives."""
        pinned = {} if query is None else {
            name: values for name in ("type", "source", "subject", TOPIC_ATTRIBUTE)
            if (values := required_values(query, {}, name)) is not None}
        if "type" in pinned and all(t.startswith(TICK_TYPE) for t in pinned["type"]):
            return Selection((), "a time class: its ticks come from the mediator's clock")
        filters: list[str] = []
        notes: list[str] = []
        for number, rule in enumerate(self.rules, 1):
            found, note = self._rule_filters(rule, pinned)
            filters.extend(found)
            notes.append(f"rule {number} ({rule.pattern.text}): {note}")
        return Selection(tuple(disjoint(filters)), "; ".join(notes))

    def _rule_filters(self, rule: Rule, pinned: dict[str, frozenset[str]]
                      ) -> tuple[list[str], str]:
        kinds = {w.index: w.kind for w in rule.pattern.wilds}
        templates = rule.templates()
        assignments: list[dict[int, str]] = [{}]
        used: list[str] = []
        for name, values in sorted(pinned.items()):
            template = (Template("{topic}", (TOPIC,)) if name == TOPIC_ATTRIBUTE
                        else templates.get(name))
            if template is None:
                if name == "subject":
                    return [], "it sets no subject, the query requires one"
                continue
            options: list[dict[int, str]] | None = []
            for value in sorted(values):
                solved = template.invert(value, kinds)
                if solved is None or options is None:
                    options = None
                    break
                options.extend(solved)
            if options is None:
                continue  # too many readings: this attribute does not narrow
            joined = [merged for a in assignments for b in options
                      if (merged := _merge(a, b)) is not None]
            if len(joined) > MAX_SOLUTIONS:
                continue
            assignments = joined
            used.append(name)
        filters: list[str] = []
        for assigned in assignments:
            filters.extend(self._assigned_filters(rule, assigned))
        if not filters:
            return [], f"cannot produce the {' and '.join(used)} the query requires"
        if not used:
            return [rule.pattern.broker_filter], "the whole pattern (the query pins nothing " \
                "the rule's templates can be read back through)"
        return filters, f"narrowed by {' and '.join(used)}"

    def _assigned_filters(self, rule: Rule, assigned: dict[int, str]) -> list[str]:
        if TOPIC in assigned:
            captures = rule.pattern.match(assigned[TOPIC])
            if captures is None or _merge(captures, assigned) is None:
                return []
            return [assigned[TOPIC]]
        first = rule.pattern.levels[0]
        if isinstance(first, Wild) and assigned.get(first.index, "").startswith("$"):
            return []  # a wildcard first level never sees a $ topic
        return rule.pattern.filters(assigned)


def _merge(a: MappingType[int, str], b: MappingType[int, str]) -> dict[int, str] | None:
    out = dict(a)
    for key, value in b.items():
        if out.setdefault(key, value) != value:
            return None
    return out


# ------------------------------------------------------------------ topic filter algebra


def subsumes(f: str, g: str) -> bool:
    """Whether filter ``f`` matches every topic filter ``g`` matches."""
    fs, gs = f.split("/"), g.split("/")
    if gs[0].startswith("$") and fs[0] in ("+", "#"):
        return False
    for i, level in enumerate(fs):
        if level == "#":
            return True
        if i >= len(gs) or gs[i] == "#" or (level != "+" and (gs[i] == "+" or gs[i] != level)):
            return False
    return len(fs) == len(gs)


def overlaps(f: str, g: str) -> bool:
    """Whether some topic matches both filters."""
    fs, gs = f.split("/"), g.split("/")
    if (fs[0] in ("+", "#") and gs[0].startswith("$")) or (
            gs[0] in ("+", "#") and fs[0].startswith("$")):
        return False
    for a, b in zip(fs, gs, strict=False):
        if a == "#" or b == "#":
            return True
        if a != b and a != "+" and b != "+":
            return False
    if len(fs) == len(gs):
        return True
    longer = fs if len(fs) > len(gs) else gs
    return len(longer) == min(len(fs), len(gs)) + 1 and longer[-1] == "#"


def generalize(f: str, g: str) -> str:
    """The narrowest filter (of this shape) matching everything either matches."""
    fs, gs = f.split("/"), g.split("/")
    out: list[str] = []
    for a, b in zip(fs, gs, strict=False):
        if a == "#" or b == "#":
            return "/".join([*out, "#"])
        out.append(a if a == b else "+")
    if len(fs) != len(gs):
        out.append("#")
    return "/".join(out)


def disjoint(filters: Iterable[str]) -> list[str]:
    """Filters matching at least what ``filters`` match, no two of them the same topic: those
    another one covers are dropped, two that overlap are replaced by their generalization."""
    current = list(dict.fromkeys(filters))
    changed = True
    while changed:
        changed = False
        for f, g in itertools.permutations(current, 2):
            if subsumes(f, g):
                current.remove(g)
                changed = True
                break
            if overlaps(f, g):
                current = [x for x in current if x not in (f, g)]
                current.append(generalize(f, g))
                changed = True
                break
    return sorted(current)


# ------------------------------------------------------------------ the configuration

_RULE_KEYS = {"topic", "type", "source", "subject", "time", "id", "non_json", "retained"}
DEFAULT_SOURCE = "mqtt://{broker}/{topic}"


def parse_mapping(broker: str, rules: Sequence[MappingType[str, Any]]) -> Mapping:
    """A broker's mapping from its configuration (TOML's ``[[sources.rules]]`` tables)::

        topic = "plant/+line/+sensor/reading"   # an MQTT filter; a wildcard may be named
        type = "plant.{sensor}.reading"         # required
        source = "mqtt://{broker}/{line}"       # default "mqtt://{broker}/{topic}"
        subject = "{sensor}"                    # optional
        time = {field = "ts", format = "epoch_ms"}   # absent: stamped on arrival
        id = {field = "msg_id"}                 # absent: derived from the packet
        non_json = "base64"                     # or "dead-letter"
        retained = "ignore"                     # or "accept"

    MappingConfigError names the rule (from 1), the key, what was found and what is expected."""
    if not isinstance(broker, str) or not broker:
        raise MappingConfigError(f"found the source name {brief_repr(broker)}, expected a "
                                 "non-empty string")
    if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence) or not rules:
        raise MappingConfigError(f"source {broker!r}: found rules {brief_repr(rules)}, expected "
                                 "a non-empty list of rules (tables with topic, type, …)")
    return Mapping(broker, tuple(_parse_rule(broker, number, raw)
                                 for number, raw in enumerate(rules, 1)))


def _parse_rule(broker: str, number: int, raw: object) -> Rule:
    where = f"source {broker!r}, rule {number}"
    if not isinstance(raw, MappingType):
        raise MappingConfigError(f"{where}: found {brief_repr(raw)}, expected a table")
    unknown = sorted(set(raw) - _RULE_KEYS)
    if unknown:
        raise MappingConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; a rule has "
                                 f"{', '.join(sorted(_RULE_KEYS))}")
    if "type" not in raw:
        raise MappingConfigError(f"{where}: 'type' is required (a template such as "
                                 "'plant.{sensor}.reading')")
    try:
        pattern = parse_pattern(raw.get("topic"))
    except MappingConfigError as exc:
        raise MappingConfigError(f"{where}: {exc}") from None

    def template(key: str, default: str | None) -> Template | None:
        value = raw.get(key, default)
        if value is None:
            return None
        try:
            return parse_template(value, key, pattern, broker)
        except MappingConfigError as exc:
            raise MappingConfigError(f"{where}: {exc}") from None

    time_field, time_format = _time_setting(where, raw.get("time"))
    id_field = _field_setting(where, "id", raw.get("id"))
    type_ = template("type", None)
    source = template("source", DEFAULT_SOURCE)
    assert type_ is not None and source is not None
    return Rule(pattern, type_, source, template("subject", None), time_field, time_format,
                id_field, _choice(where, "non_json", raw.get("non_json", "base64"), NON_JSON),
                _choice(where, "retained", raw.get("retained", "ignore"), RETAINED))


def _choice(where: str, key: str, value: object, options: tuple[str, ...]) -> str:
    if value not in options:
        raise MappingConfigError(f"{where}: {key} is {brief_repr(value)}, expected one of "
                                 f"{', '.join(repr(o) for o in options)}")
    return str(value)


def _field_setting(where: str, key: str, value: object) -> str:
    if value is None:
        return ""
    path = value.get("field") if isinstance(value, MappingType) else None
    if not isinstance(path, str) or not path or any(not p for p in path.split(".")):
        raise MappingConfigError(f"{where}: {key} is {brief_repr(value)}, expected a table "
                                 f"{{field = \"a.dotted.path\"}} naming a payload field")
    return path


def _time_setting(where: str, value: object) -> tuple[str, TimeFormat]:
    path = _field_setting(where, "time", value)
    if not path:
        return "", "rfc3339"
    assert isinstance(value, MappingType)
    unknown = sorted(set(value) - {"field", "format"})
    if unknown:
        raise MappingConfigError(f"{where}: time has unknown key(s) {', '.join(unknown)}; it has "
                                 "field and format")
    fmt = _choice(where, "time.format", value.get("format", "rfc3339"), TIME_FORMATS)
    return path, fmt  # type: ignore[return-value]

