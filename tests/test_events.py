"""The event model: CloudEvents 1.0 in and out, integer-microsecond time."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eva.events import (
    Event,
    EventError,
    format_time,
    from_cloudevent,
    from_fields,
    from_json_line,
    parse_time,
    to_cloudevent,
)

GOOD = {"specversion": "1.0", "id": "e1", "source": "urn:x", "type": "truck.location",
        "time": "2026-03-02T10:00:00.5+02:00", "subject": "T1", "data": {"area": "A", "n": {"k": 1}}}


def test_cloudevent_round_trip_keeps_attributes_and_data() -> None:
    event = from_cloudevent(GOOD, 7)
    assert event.time == parse_time("2026-03-02T08:00:00.500000Z") and event.seq == 7
    assert event.field("data.area") == "A" and event.field("data.n.k") == 1
    assert event.field("subject") == "T1" and event.field("data.missing") is None
    out = to_cloudevent(event)
    assert out["time"] == "2026-03-02T08:00:00.500000Z" and out["subject"] == "T1"


@pytest.mark.parametrize(("patch", "message"), [
    ({"specversion": "0.3"}, "specversion"),
    ({"time": "yesterday"}, "RFC 3339"),
    ({"time": "2026-03-02T10:00:00"}, "no UTC offset"),
    ({"id": ""}, "non-empty string"),
    ({"type": 5}, "non-empty string"),
])
def test_malformed_events_are_rejected_with_the_reason(patch: dict, message: str) -> None:
    with pytest.raises(EventError, match=message):
        from_cloudevent({**GOOD, **patch})


def test_missing_attributes_and_bad_json_are_reported() -> None:
    with pytest.raises(EventError, match="missing required attribute"):
        from_cloudevent({"id": "x"})
    with pytest.raises(EventError, match="not JSON"):
        from_json_line("{")
    with pytest.raises(EventError, match="not a JSON object"):
        from_json_line("[1]")


@given(st.integers(0, 4_000_000_000_000_000))
def test_time_formatting_round_trips_at_microsecond_precision(micros: int) -> None:
    assert parse_time(format_time(micros)) == micros


def test_events_compare_by_identity_fields_not_attributes() -> None:
    assert Event("a", "s", "t", 1, 0, None, {"x": 1}) == Event("a", "s", "t", 1, 0, None, {})


@given(st.integers(min_value=0, max_value=4_102_444_800_000_000),
       st.sampled_from(["", ".{ms:03d}", ".{us:06d}", ".{d}", "+00:00", "+05:30", "z"]),
       st.sampled_from(["T", "t"]))
def test_the_fast_timestamp_path_agrees_with_the_general_parser(
        micros: int, tail: str, sep: str) -> None:
    """parse_time reads the common shape through a per-minute cache; every RFC 3339 shape
    must give what the general parser gives (events.py)."""
    from eva.events import _parse_time

    base = format_time(micros - micros % 1_000_000)[:19].replace("T", sep)
    text = base + tail.format(ms=micros % 1000, us=micros % 1_000_000, d=micros % 10)
    text += "" if tail.startswith(("+", "z")) else "Z"
    assert parse_time(text) == _parse_time(text)
    assert parse_time(text) == parse_time(text)  # the second time from the cache


@given(st.lists(st.tuples(st.sampled_from(["2026-03-02T10:00", "2026-03-02T10:01",
                                           "2026-02-30T10:00", "2026-03-02t10:00"]),
                          st.text(st.sampled_from("0159:a\u0663 "), min_size=2, max_size=2),
                          st.sampled_from(["Z", ".123Z", ".123456Z", ".12aZ", "z"])),
                min_size=1, max_size=6))
def test_the_last_minute_path_agrees_with_the_general_parser(
        texts: list[tuple[str, str, str]]) -> None:
    """Consecutive times, in the same minute or not, with any characters for the seconds:
    the value or the refusal of the general parser."""
    from eva.events import _parse_time

    def outcome(read: Callable[[str], int], text: str) -> object:
        try:
            return read(text)
        except EventError as exc:
            return str(exc)

    for minute, second, tail in texts:
        text = f"{minute}:{second}{tail}"
        assert outcome(parse_time, text) == outcome(_parse_time, text), text


def test_what_orjson_refuses_json_still_reads() -> None:
    import math

    head = '{"specversion": "1.0", "id": "a", "source": "s", "type": "t", ' \
           '"time": "2026-01-01T00:00:00Z", '
    data = from_json_line(head + '"data": {"x": NaN, "big": 123456789012345678901234567890}}').data
    assert math.isnan(data["x"]) and data["big"] == 123456789012345678901234567890
    assert from_json_line(head + '"data": "\\ud800"}').data == "\ud800"
    assert from_json_line(head + '"data": 1.5e400}').data == math.inf


def test_bad_json_reports_the_standard_message() -> None:
    with pytest.raises(EventError, match=r"not JSON: Expecting ',' delimiter at column 10"):
        from_json_line('{"id": 1 "x": 2}')


# ---------------------------------------------------------------- from_fields: data parsed lazily

LAZY_DATA = b'{"area": "A", "n": {"k": 1}, "big": 123456789012345678901234567890}'


def test_an_event_from_fields_is_the_event_of_its_line() -> None:
    """Equality, hashing, repr, fields and pickling of an event whose data is kept as text are
    those of the event made from its line; the text is parsed on first read only."""
    import pickle

    line = (b'{"specversion": "1.0", "id": "e1", "source": "urn:x", "type": "t", '
            b'"time": "2026-03-02T08:00:00Z", "subject": "T1", "data": ' + LAZY_DATA + b"}")
    eager = from_json_line(line, 3)
    lazy = from_fields("e1", "urn:x", "t", eager.time, 3, LAZY_DATA,
                       {"specversion": "1.0", "subject": "T1"})
    assert lazy._raw is not None  # not parsed yet
    assert lazy == eager and repr(lazy) == repr(eager)
    assert lazy._raw is None and lazy.field("data.n.k") == 1
    assert lazy.field("data.big") == 123456789012345678901234567890
    assert pickle.loads(pickle.dumps(lazy)) == eager
    assert to_cloudevent(lazy) == to_cloudevent(eager)
    renumbered = from_fields("e1", "urn:x", "t", 5, 0, "[1, 2]").renumbered(9)
    assert renumbered._raw == "[1, 2]" and renumbered.seq == 9 and renumbered.data == [1, 2]
    assert hash(from_fields("e1", "s", "t", 5, 0, '"x"')) == hash(Event("e1", "s", "t", 5, 0, "x"))
    assert from_fields("e1", "s", "t", 5).data is None
    assert from_fields("e1", "s", "t", 5, 0, "null") == from_fields("e1", "s", "t", 5)


@pytest.mark.parametrize(("text", "reads"), [
    ("{", "{"), (b"{\xff}", "{\\xff}"), ("", ""), ("abc", "abc"), ("[" * 100 + "]" * 100,
                                                                    "[" * 100 + "]" * 100),
    ("NaN", None), ('"\\ud800"', "\ud800"), ("[" * 99 + "]" * 99, None)])
def test_data_text_that_does_not_parse_reads_as_the_text(text: str | bytes, reads: Any) -> None:
    """What a line could not carry as its data (not JSON, deeper than a line allows) reads as
    the text itself: a predicate on it never raises, and nothing is lost."""
    import math

    event = from_fields("e1", "s", "t", 5, 0, text)
    assert event.field("data.area") is None
    if reads is None:
        assert event.data is not None and (text != "NaN" or math.isnan(event.data))
    else:
        assert event.data == reads


def test_a_lazy_event_snapshots_as_its_parsed_data() -> None:
    """eva/snapshot.py writes an event by its fields: held and buffered lazy events restore
    as the events of their lines, and the engine answers as it would have."""
    from eva.engine import Engine, EngineConfig
    from eva.notify import composite_line
    from eva.parser import parse
    from eva.snapshot import restore, snapshot

    doc = parse('class A = type == "A" and data.k == 1\nclass B = type == "B"\n'
                "profile P per data.p = ((all_dup(A); all_dup(B))_5s)_all_pairs\n")
    config = EngineConfig(allowed_lateness=3_000_000)

    def events(lazy: bool) -> list[Event]:
        out = []
        for i in range(12):
            text = f'{{"k": {i % 2}, "p": "x{i // 8}"}}'
            kind = "AB"[i % 4 == 3]
            out.append(from_fields(f"e{i}", "s", kind, i * 1_000_000, i, text) if lazy
                       else Event(f"e{i}", "s", kind, i * 1_000_000, i, json.loads(text)))
        return out

    def run(lazy: bool) -> list[str]:
        engine = Engine(config)
        engine.add_document(doc)
        trace = events(lazy)
        out = [n for e in trace[:6] for n in engine.push(e)]
        engine = restore(snapshot(engine))
        out += [n for e in trace[6:] for n in engine.push(e)] + engine.close()
        return [composite_line(n)[1] for n in out]

    assert run(True) == run(False) and run(True)


def test_the_time_caches_stay_bounded() -> None:
    """A trace spanning years of minutes keeps at most _CACHED minutes each way (replay's
    memory stays flat in the trace)."""
    from eva import events

    for minute in range(3 * events._CACHED):
        micros = 1_767_225_600_000_000 + minute * 60_000_000 + 7_000_123
        assert parse_time(format_time(micros)) == micros
    assert len(events._MINUTES) <= events._CACHED and len(events._STAMPS) <= events._CACHED
