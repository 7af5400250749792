"""Fuzzing the event decoder (issue 11): bytes, text lines and structured mutations of a valid
CloudEvent. Every input is accepted or refused with a reason (:class:`EventError`) — never
another exception — and whatever is accepted goes through the engine and out as UTF-8 JSON.
Bounded: the whole file runs in well under a minute."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva.engine import DeadLetter, Engine, EngineConfig
from eva.events import (
    MAX_TIME,
    MIN_TIME,
    Event,
    EventError,
    format_time,
    from_fields,
    from_json_line,
    parse_time,
    read_lines,
    to_cloudevent,
)
from eva.notify import composite_line, dead_letter_record
from eva.parser import parse

FUZZ = settings(max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROFILES = parse('class T = type == "t"\nclass U = type == "u"\n'
                 "profile P = ((all_dup(T); all_dup(U))_1h)_all_pairs\n"
                 "profile N = ((not T)_1s)_unique_pairs\n")
GOOD: dict[str, Any] = {"specversion": "1.0", "id": "e1", "source": "urn:s", "type": "t",
                        "time": "2026-03-02T10:00:00.5+02:00", "subject": "x",
                        "data": {"area": "A", "n": 1}}

# Any Unicode, lone surrogates included (what a text layer makes of invalid UTF-8).
anychar = st.characters(codec=None, exclude_categories=())
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(anychar, max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=12)

STAMPS = ["2026-03-02T10:00:00Z", "2026-03-02t10:00:00.123z", "2026-03-02T10:00:00.5+02:00",
          "0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "2026-03-02T10:00:00.1234567Z"]


@st.composite
def stamps(draw: st.DrawFn) -> str:
    """Valid RFC 3339 times and near misses: one character replaced, dropped or doubled."""
    text = draw(st.sampled_from(STAMPS))
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(text) - 1))
        edit = draw(st.sampled_from(["replace", "drop", "double"]))
        if edit == "replace":
            text = text[:i] + draw(st.sampled_from("0129:-+.TtZz \uff34\uff10/")) + text[i + 1:]
        elif edit == "drop":
            text = text[:i] + text[i + 1:]
        else:
            text = text[:i] + text[i] + text[i:]
    return text


@st.composite
def mutated_events(draw: st.DrawFn) -> bytes:
    """A valid event with a few attributes replaced, dropped, deeply nested, made huge
    integers, or repeated (ids repeat), serialised and then perhaps corrupted byte by byte."""
    obj: dict[str, Any] = dict(GOOD)
    obj["id"] = draw(st.sampled_from(["e1", "e2", "e3"]))
    obj["type"] = draw(st.sampled_from(["t", "u"]))
    obj["time"] = draw(stamps())
    raw: dict[str, str] = {}  # attributes written as JSON text (json.dumps would refuse them)
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from([*GOOD, "extension"]))
        choice = draw(st.integers(0, 4))
        obj.pop(name, None)
        raw.pop(name, None)
        if choice == 1:
            obj[name] = draw(json_values)
        elif choice == 2:
            depth = draw(st.sampled_from([50, 99, 100, 101, 999, 1000, 1030, 3000]))
            raw[name] = "[" * depth + "]" * depth
        elif choice == 3:
            raw[name] = "-" * draw(st.booleans()) + "7" * draw(st.sampled_from(
                [19, 20, 4300, 4301, 6000]))
        elif choice == 4:
            obj[name] = draw(st.text(anychar, max_size=8))
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    text = text[:-1] + "".join(f", {json.dumps(k)}: {v}" for k, v in raw.items()) + "}"
    data = text.encode("utf-8", "surrogatepass")
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(data)))
        data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
    return data


def decoded(line: str | bytes) -> Event | None:
    """The event, or None when refused: any exception other than EventError fails the test."""
    try:
        event = from_json_line(line)
    except EventError as exc:
        assert str(exc)  # a reason
        return None
    assert MIN_TIME <= event.time <= MAX_TIME
    json.dumps(to_cloudevent(event)).encode("utf-8")  # writable as the dead letter's event
    return event


def through_the_engine(lines: list[str | bytes]) -> None:
    """Accepted events through an engine with a horizon; every output line is UTF-8 JSON."""
    written: list[str] = []

    def letter(d: DeadLetter) -> None:
        assert d.reason in ("late", "future", "duplicate", "malformed") and d.detail
        written.append(json.dumps(dead_letter_record(d)))

    engine = Engine(EngineConfig(horizon=3_600_000_000), letter)
    engine.add_document(PROFILES)
    notes = []
    for seq, line in enumerate(lines):
        try:
            event = from_json_line(line, seq)
        except EventError as exc:
            engine.malformed(str(exc), line if isinstance(line, str) else None)
            continue
        notes.extend(engine.push(event))
    notes.extend(engine.close())
    written.extend(composite_line(n)[1] for n in notes)
    for text in written:
        text.encode("utf-8")


@FUZZ
@given(st.binary(max_size=200))
def test_any_bytes_are_an_event_or_a_dead_letter(line: bytes) -> None:
    decoded(line)


@FUZZ
@given(st.text(anychar, max_size=200))
def test_any_text_is_an_event_or_a_dead_letter(line: str) -> None:
    decoded(line)
    decoded(line.encode("utf-8", "surrogatepass"))


@FUZZ
@given(st.lists(mutated_events(), min_size=1, max_size=8))
def test_mutated_cloudevents_are_events_or_dead_letters_end_to_end(lines: list[bytes]) -> None:
    for line in lines:
        decoded(line)
    through_the_engine(list(lines))


@FUZZ
@given(st.one_of(stamps(), st.text(anychar, max_size=40)))
def test_any_time_text_parses_in_range_or_is_refused(text: str) -> None:
    try:
        micros = parse_time(text)
    except EventError as exc:
        assert "time" in str(exc)
        return
    assert MIN_TIME <= micros <= MAX_TIME
    assert parse_time(format_time(micros)) == micros


# Integers of every size a 64-bit decoder gets wrong, and the sizes around its limits.
big_integers = st.one_of(
    st.integers(), st.integers(-(2**70), 2**70),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]),
    st.integers(1, 4300).map(lambda n: int("7" * n)),
    st.integers(1, 4300).map(lambda n: -int("9" * n)))
int_values = st.recursive(
    st.one_of(big_integers, st.floats(allow_nan=False, allow_infinity=False),
              st.from_regex(r"[0-9]{0,30}", fullmatch=True)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8)


@FUZZ
@given(int_values, st.booleans(), st.booleans())
def test_integers_in_data_survive_exactly(value: Any, as_bytes: bool, ascii_only: bool) -> None:
    """Every integer comes out as the same int (orjson reads those beyond 64 bits as floats;
    12345678901234567890123 and …124 were one P2 partition), floats as the same floats."""
    obj = dict(GOOD, data=value)
    text = json.dumps(obj, ensure_ascii=ascii_only)
    event = from_json_line(text.encode() if as_bytes else text)
    assert json.dumps(event.data) == json.dumps(value)  # 10**22 and 1e22 print differently


@FUZZ
@given(st.lists(st.one_of(mutated_events(), st.binary(max_size=80)), min_size=1, max_size=8))
def test_the_batch_reader_reads_each_line_as_from_json_line(lines: list[bytes]) -> None:
    """events.read_lines (the replay reader) gives, line by line, the event from_json_line
    gives or its error, with the same message: never another exception."""
    batch = list(enumerate(lines, start=1))
    for (number, line), got in zip(batch, read_lines(batch), strict=True):
        try:
            want = from_json_line(line, number)
        except EventError as exc:
            assert isinstance(got, EventError) and str(got) == str(exc)
        else:
            assert isinstance(got, Event) and repr(got) == repr(want)  # repr: NaN too


LAZY = parse('class T = type == "t" and data.area == "A"\nclass U = data.n.k > 0\n'
             "profile P per data.n = ((all_dup(T); all_dup(U))_1h)_all_pairs\n")


@FUZZ
@given(st.one_of(st.binary(max_size=60), st.text(anychar, max_size=60),
                 json_values.map(json.dumps), int_values.map(json.dumps)))
def test_data_kept_as_text_never_raises_and_reads_as_a_lines_data(text: str | bytes) -> None:
    """from_fields with any data text: reading it (a predicate, a per key, an output) never
    raises; a text that is one JSON value reads as that value does in a line."""
    event = from_fields("e1", "s", "t", 0, 0, text)
    engine = Engine(EngineConfig())
    engine.add_document(LAZY)
    engine.push(event)
    engine.push(from_fields("e2", "s", "u", 1, 1, text))
    for n in engine.close():
        composite_line(n)
    json.dumps(to_cloudevent(event)).encode("utf-8", "surrogatepass")
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return  # not one JSON value: reads as the text (tests/test_events.py)
    raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    line = (b'{"specversion": "1.0", "id": "e1", "source": "s", "type": "t", '
            b'"time": "2026-01-01T00:00:00Z", "data": ' + raw + b"}")
    try:
        want = from_json_line(line)
    except EventError:
        return
    assert repr(from_fields("e1", "s", "t", 0, 0, text).data) == repr(want.data)
