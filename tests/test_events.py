"""The event model: CloudEvents 1.0 in and out, integer-microsecond time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eva.events import (
    Event,
    EventError,
    format_time,
    from_cloudevent,
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
    """parse_time reads the common shape through a per-second cache; every RFC 3339 shape
    must give what the general parser gives (events.py)."""
    from eva.events import _parse_time

    base = format_time(micros - micros % 1_000_000)[:19].replace("T", sep)
    text = base + tail.format(ms=micros % 1000, us=micros % 1_000_000, d=micros % 10)
    text += "" if tail.startswith(("+", "z")) else "Z"
    assert parse_time(text) == _parse_time(text)
    assert parse_time(text) == parse_time(text)  # the second time from the cache


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
