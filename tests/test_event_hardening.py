"""Issue 11, events: whatever a line holds, it is admitted or becomes a dead letter with a reason,
and the run goes on — invalid UTF-8, deep JSON, huge integers, times outside years 0001–9999,
ISO 8601 forms that are not RFC 3339, far-future typos, duplicate ids; and a clock stepped
across a long quiet gap costs what it reports, not the number of its ticks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from eva import engine as engine_module
from eva.engine import DeadLetter, Engine, EngineConfig, replay
from eva.events import (
    MAX_DEPTH,
    MAX_TIME,
    MIN_TIME,
    Event,
    EventError,
    format_time,
    from_json_line,
    parse_time,
    to_cloudevent,
)
from eva.parser import parse
from eva.reference import evaluate
from mediator.cli import app
from tests.helpers import both, profile_doc, run, signature
from tests.strategies import documents, trace_of

HEAD = ('{"specversion": "1.0", "id": "a", "source": "s", "type": "t", '
        '"time": "2026-01-01T00:00:00Z"')
DAY = 86_400_000_000


def changed(event: Event, **changes: Any) -> Event:
    """``event`` with some fields changed (an Event is not a dataclass: its data may be lazy)."""
    fields = {"id": event.id, "source": event.source, "type": event.type, "time": event.time,
              "seq": event.seq, "data": event.data, "attributes": event.attributes}
    return Event(**{**fields, **changes})


def line(**extra: str) -> str:
    """An event line with ``extra`` JSON texts as attribute values."""
    return HEAD + "".join(f", {json.dumps(k)}: {v}" for k, v in extra.items()) + "}"


# ---------------------------------------------------------------- the decoder


def test_invalid_utf8_is_malformed_naming_the_byte() -> None:
    with pytest.raises(EventError, match=r"not UTF-8: byte 0xff at byte 32"):
        from_json_line(b'{"specversion": "1.0", "id": "a\xff"}')


def test_unpaired_surrogates_are_refused_in_attributes_but_kept_in_data() -> None:
    # What a text layer makes of invalid UTF-8 (surrogateescape), and a JSON escape.
    for bad in ('"b\udcff"', '"\\ud800"'):
        with pytest.raises(EventError, match="unpaired surrogate"):
            from_json_line(HEAD.replace('"id": "a"', f'"id": {bad}') + "}")
        with pytest.raises(EventError, match="'subject' contains an unpaired surrogate"):
            from_json_line(line(subject=bad))
    assert from_json_line(line(data='"\\ud800"')).data == "\ud800"  # JSON payload: any string


@pytest.mark.parametrize("text", [False, True])
@pytest.mark.parametrize("depth", [1000, 1100, 5000])
def test_deep_json_is_malformed_not_a_recursion_error(depth: int, text: bool) -> None:
    raw = line(data="[" * depth + "]" * depth)
    with pytest.raises(EventError, match=f"nested deeper than {MAX_DEPTH} levels"):
        from_json_line(raw if text else raw.encode())
    # Through json's fallback too (orjson refuses NaN first).
    with pytest.raises(EventError, match=f"nested deeper than {MAX_DEPTH} levels"):
        from_json_line(line(x="NaN", data="[" * depth + "]" * depth))


def test_nesting_up_to_the_limit_is_accepted() -> None:
    depth = MAX_DEPTH - 1  # the event object is level 1
    assert from_json_line(line(data="[" * depth + "]" * depth)).data is not None
    with pytest.raises(EventError, match="nested deeper"):
        from_json_line(line(data="[" * (depth + 1) + "]" * (depth + 1)))


def test_integers_beyond_the_digit_limit_are_malformed() -> None:
    with pytest.raises(EventError, match="integer of more than 4300 digits"):
        from_json_line(line(data="9" * 5000))
    assert from_json_line(line(data="9" * 4300)).data == int("9" * 4300)


@pytest.mark.parametrize("big", [12345678901234567890123, -9999999999999999999, 2**64,
                                 -(2**63) - 1, 2**64 - 1, -(2**63), 10**4299])
def test_integers_beyond_64_bits_are_read_exactly(big: int) -> None:
    """orjson reads an integer outside [−2^63, 2^64) as a float: it is read again with json."""
    for raw in (line(data=f'{{"customer": {big}, "note": "{"9" * 30}"}}'),
                line(data=f"[1.5, {big}]", subject='"12345678901234567890123"')):
        for text in (raw, raw.encode()):
            data = from_json_line(text).data
            values = [data["customer"]] if isinstance(data, dict) else data[1:]
            assert values == [big] and type(values[0]) is int


def test_customers_beyond_64_bits_are_two_partitions_of_p2() -> None:
    """12345678901234567890123 and …124 were one float, so P2 paired two customers."""
    doc = parse(Path("examples/logistics/profiles.eva").read_text())
    lines = [HEAD.replace('"a"', f'"c{i}"').replace('"t"', '"order.cancelled"')
             + f', "data": {{"customer": 1234567890123456789012{i}}}}}' for i in (3, 4)]
    trace = [from_json_line(text, i) for i, text in enumerate(lines)]
    assert [e.data["customer"] for e in trace] == [12345678901234567890123,
                                                  12345678901234567890124]
    assert replay(doc, trace, profiles=["P2"]) == []


@pytest.mark.parametrize("stamp", ["0001-01-01T00:30:00+01:00", "9999-12-31T23:30:00-01:00"])
def test_times_outside_years_1_to_9999_in_utc_are_refused(stamp: str) -> None:
    with pytest.raises(EventError, match="is outside 0001-01-01T00:00:00Z"):
        parse_time(stamp)


def test_the_extreme_times_parse_and_format_and_format_never_raises() -> None:
    assert parse_time("0001-01-01T00:00:00Z") == MIN_TIME
    assert parse_time("9999-12-31T23:59:59.999999Z") == MAX_TIME
    assert format_time(MIN_TIME) == "0001-01-01T00:00:00Z"  # strftime would print "1-01-01"
    assert format_time(MAX_TIME) == "9999-12-31T23:59:59.999999Z"
    # A clock tick before the first event minus a long lateness can lie outside the range.
    assert format_time(MIN_TIME - 1) == "0000-12-31T23:59:59.999999Z"
    assert format_time(MAX_TIME + 1) == "10000-01-01T00:00:00Z"
    assert format_time(-(2**62)).startswith("-")


@pytest.mark.parametrize(("stamp", "message"), [
    ("20260302T100000Z", "not an RFC 3339 timestamp: expected YYYY-MM-DDTHH:MM:SS"),
    ("2026-03-02T10Z", "not an RFC 3339 timestamp"),
    ("2026-03-02T10:00Z", "not an RFC 3339 timestamp"),
    ("2026-W10-1T10:00:00Z", "not an RFC 3339 timestamp"),
    ("2026-061T10:00:00Z", "not an RFC 3339 timestamp"),
    ("2026-03-02\uff3410:00:00Z", "not an RFC 3339 timestamp"),  # full-width T
    ("2026-03-02 10:00:00Z", "not an RFC 3339 timestamp"),
    ("2026-03-02_10:00:00Z", "not an RFC 3339 timestamp"),
    ("\uff12\uff10\uff12\uff16-03-02T10:00:00Z", "not an RFC 3339 timestamp"),  # full-width digits
    ("2026-03-02T10:00:00.Z", "not an RFC 3339 timestamp"),
    ("2026-03-02T10:00:00+0100", "not an RFC 3339 timestamp"),
    ("2026-03-02T10:00:00+01", "not an RFC 3339 timestamp"),
    (" 2026-03-02T10:00:00Z", "not an RFC 3339 timestamp"),
    ("2026-03-02T10:00:00", "has no UTC offset"),
    ("2026-03-02T10:00:00+24:00", "UTC offset \\+24:00"),
    ("2026-02-30T10:00:00Z", "not a valid date and time"),
    ("2026-03-02T24:00:00Z", "not a valid date and time"),
    ("2016-12-31T23:59:60Z", "leap second"),
    ("2026-03-02T10:00:00.123456789Z", "9 fractional digits"),
    ("2026-03-02T10:00:00.0000001Z", "7 fractional digits"),
])
def test_only_rfc3339_is_accepted_and_the_refusal_names_the_format(stamp: str,
                                                                   message: str) -> None:
    with pytest.raises(EventError, match=message):
        parse_time(stamp)


@pytest.mark.parametrize(("stamp", "utc"), [
    ("2026-03-02t10:00:00z", "2026-03-02T10:00:00Z"),  # RFC 3339 §5.6: 'T', 'Z' either case
    ("2026-03-02T10:00:00.5+02:00", "2026-03-02T08:00:00.500000Z"),
    ("2026-03-02T10:00:00-00:00", "2026-03-02T10:00:00Z"),
    ("2026-03-02T10:00:00.1234Z", "2026-03-02T10:00:00.123400Z"),
    ("2026-03-02T10:00:00.123456000Z", "2026-03-02T10:00:00.123456Z"),  # zeros beyond µs
    ("2026-03-02T23:30:00-01:00", "2026-03-03T00:30:00Z"),
])
def test_rfc3339_variants_are_exact(stamp: str, utc: str) -> None:
    assert format_time(parse_time(stamp)) == utc


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=__import__("datetime").datetime(1, 1, 2),
                    max_value=__import__("datetime").datetime(9999, 12, 30)),
       st.integers(-23 * 60 - 59, 23 * 60 + 59), st.integers(0, 9))
def test_parse_time_agrees_with_datetime_on_every_rfc3339_shape(
        when: object, offset_minutes: int, digits: int) -> None:
    from datetime import UTC, datetime, timedelta, timezone

    assert isinstance(when, datetime)
    zone = timezone(timedelta(minutes=offset_minutes))
    local = when.replace(tzinfo=zone)
    fraction = f"{local.microsecond:06d}".ljust(digits, "0")[:digits] if digits else ""
    sign = "+" if offset_minutes >= 0 else "-"
    text = (local.strftime("%Y-%m-%dT%H:%M:%S").rjust(19, "0") + (f".{fraction}" if fraction
                                                                  else "")
            + f"{sign}{abs(offset_minutes) // 60:02d}:{abs(offset_minutes) % 60:02d}")
    exact = local.replace(microsecond=int(fraction.ljust(6, "0")[:6]) if fraction else 0)
    expected = (exact - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    assert parse_time(text) == expected


# ---------------------------------------------------------------- admission


def engine_with(text: str, **config: object) -> tuple[Engine, list[DeadLetter]]:
    letters: list[DeadLetter] = []
    engine = Engine(EngineConfig(**config), letters.append)  # type: ignore[arg-type]
    engine.add_document(profile_doc(text))
    return engine, letters


def test_an_event_beyond_the_horizon_is_a_future_dead_letter_and_the_run_goes_on() -> None:
    engine, letters = engine_with(" = ((all_dup(A); all_dup(B))_5us)_all_pairs", horizon=100)
    got = run(engine, trace_of("a1@10 b9@9999999 b1@12 a2@112 b2@213"))
    assert [(d.reason, d.event.id if d.event else None) for d in letters] == [
        ("future", "b9"), ("future", "b2")]  # measured from the newest admitted time: 112
    assert "more than 100us ahead of the newest event time" in letters[0].detail
    assert got == [("a1", "b1")]


def test_a_typo_in_the_first_event_sets_the_clock_and_the_rest_is_late() -> None:
    """The first event has no watermark to be measured from: it starts the clock (registration
    = its time − lateness), so the good events after a far-future first one are late, each a
    dead letter naming the watermark that refuses it — nothing stalls, nothing is lost."""
    engine, letters = engine_with(" = ((all_dup(A); all_dup(B))_5us)_all_pairs", horizon=100)
    got = run(engine, trace_of("a0@9000000 a1@10 b1@12"))
    assert got == []
    assert [(d.reason, d.event.id if d.event else None) for d in letters] == [
        ("late", "a1"), ("late", "b1")]
    assert "behind the watermark: its source's newest event time" in letters[0].detail


def test_late_letters_say_which_watermark() -> None:
    engine, letters = engine_with(" = ((all_dup(A); all_dup(B))_5us)_all_pairs",
                                  allowed_lateness=2)
    run(engine, trace_of("a1@10 b1@20 a0@17"))
    assert letters[0].reason == "late"
    assert letters[0].detail.endswith("minus the allowed lateness 2us")


def test_duplicate_source_and_id_is_a_dead_letter_and_composites_keep_distinct_ids() -> None:
    from eva.notify import composite_id

    engine, letters = engine_with(" = ((all_dup(A); all_dup(B))_5us)_all_pairs")
    out = []
    for e in trace_of("a1@10 b1@11 a1@12 b2@13"):
        out.extend(engine.push(e))
    out.extend(engine.close())
    assert [(d.reason, d.event.time if d.event else None) for d in letters] == [
        ("duplicate", 12)]
    ids = [composite_id(n) for n in out]
    assert len(ids) == len(set(ids)) == 2
    # The same id from another source is another event.
    other = changed(trace_of("a1@14")[0], source="t", seq=9)
    assert engine.push(other) == [] and len(letters) == 1


def test_duplicates_are_remembered_for_the_retention_horizon_then_forgotten() -> None:
    """An id is remembered while its event's time is within the window (allowed lateness,
    the longest retention of the profiles, EngineConfig.remember) of the newest event time —
    at least that long, at most about twice. Past it a copy is admitted as a new event."""
    engine, letters = engine_with(" = ((all_dup(A); all_dup(B))_5us)_all_pairs")
    run(engine, trace_of("a1@10 b1@14 a1@15"))  # 5 after the original: within the span
    assert [d.reason for d in letters] == ["duplicate"]
    engine, letters = engine_with(" = ((all_dup(A); all_dup(B))_5us)_all_pairs")
    got = run(engine, trace_of("a1@10 b1@14 c1@18 c2@22 c3@26 a1@30 b2@31"))
    assert letters == [] and got == [("a1", "b1"), ("a1", "b2")]
    # A profile that keeps occurrences for good: remembered as long as the count allows.
    engine, letters = engine_with(" = ((all_dup(A); all_dup(B))_inf)_all_pairs")
    run(engine, trace_of("a1@10 " + " ".join(f"c{i}@{20 + i * 100}" for i in range(50))
                         + " a1@99999"))
    assert [d.reason for d in letters] == ["duplicate"]


def test_a_restored_engine_still_refuses_duplicates_and_far_futures() -> None:
    from eva.snapshot import restore, snapshot

    engine, _ = engine_with(" = ((all_dup(A); all_dup(B))_5us)_all_pairs", horizon=100)
    run(engine, trace_of("a1@10 b1@11"))
    letters: list[DeadLetter] = []
    restored = restore(snapshot(engine), letters.append)
    for e in trace_of("a1@12 a2@500"):
        restored.push(e)
    assert [d.reason for d in letters] == ["duplicate"]  # a2 is held: the next event decides
    again = restore(snapshot(restored), letters.append)  # and the snapshot holds it too
    again.push(trace_of("b2@20")[0])
    assert [d.reason for d in letters] == ["duplicate", "future"]


def test_the_duplicate_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "REMEMBERED", 100)
    engine, letters = engine_with(" = ((all_dup(A); all_dup(B))_inf)_all_pairs")
    trace = [Event(f"c{i}", "s", "c", 10 + i, i) for i in range(1000)]
    run(engine, trace)
    assert len(engine._ids) + len(engine._old_ids) <= 200
    run(engine, [Event("c999", "s", "c", 2000, 1000), Event("c0", "s", "c", 2001, 1001)])
    assert [d.event.id for d in letters if d.event] == ["c999"]  # c0: forgotten, admitted


def test_copies_at_one_instant_are_refused_when_the_window_is_zero() -> None:
    """A primitive profile without lateness has a window of 0: the memory used to rotate at
    every event, so the third event of an instant forgot the first and a copy of it was
    admitted — two composites with one id (the issue's very symptom)."""
    from eva.notify import composite_id

    engine, letters = engine_with(" = AB")
    out = []
    for e in trace_of("a1@5 b1@5 b2@5 b3@5 a1@5 b1@5 a2@6 a2@6"):
        out.extend(engine.push(e))
    out.extend(engine.close())
    assert [(d.reason, d.event.id if d.event else None) for d in letters] == [
        ("duplicate", "a1"), ("duplicate", "b1"), ("duplicate", "a2")]
    ids = [composite_id(n) for n in out]
    assert len(ids) == len(set(ids)) == 5


def test_copies_at_the_edge_of_the_window_are_refused() -> None:
    """The window is measured from the instants processed, not from each event's own time:
    a copy at its original's time plus the window is still refused (also with lateness, where
    the copy of the original's time is within it), and only past it is it forgotten."""
    engine, letters = engine_with(" = ((all_dup(A); all_dup(B))_5us)_all_pairs")
    run(engine, trace_of("a1@10 c1@15 a1@15"))  # 15 − 10 = the 5 µs window
    assert [d.reason for d in letters] == ["duplicate"]
    engine, letters = engine_with(" = A", allowed_lateness=3)
    run(engine, trace_of("a1@10 c1@11 c2@12 c3@13 a1@10"))  # 13 − 10 = the 3 µs lateness
    assert [d.reason for d in letters] == ["duplicate"]
    engine, letters = engine_with(" = A", allowed_lateness=3)
    assert run(engine, trace_of("a1@10 c1@14 c2@40 a1@40")) == [("a1",), ("a1",)]
    assert letters == []  # 30 µs later: forgotten, a new event


def test_a_copy_at_its_originals_time_is_refused_however_far_another_source_is_ahead() -> None:
    """With several sources the newest time can run far ahead of a slow source, whose copies
    are still on time: the memory follows the instants processed (held back by the slow
    source), so a copy that could be admitted is always remembered."""
    engine, letters = engine_with(" = A")
    trace = [*trace_of("a1@10", "slow"), *trace_of("c1@100 c2@200 c3@300", "fast"),
             *trace_of("a1@10", "slow")]
    assert run(engine, trace) == [("a1",)]
    assert [(d.reason, d.event.source if d.event else None) for d in letters] == [
        ("duplicate", "slow")]


# ---------------------------------------------------------------- the horizon


def test_a_far_ahead_event_is_held_and_refused_when_the_next_one_is_back() -> None:
    """An event beyond the horizon is held, not admitted: the next event (from any source)
    decides. Back near the old newest time, the held one was a typo: `future`, naming both."""
    engine, letters = engine_with(" = ((all_dup(A); all_dup(B))_5us)_all_pairs", horizon=100)
    assert run(engine, trace_of("a1@10 b9@9999999 b1@12")) == [("a1", "b1")]
    assert [(d.reason, d.event.id if d.event else None) for d in letters] == [("future", "b9")]
    assert "and the next event ('b1' at 1970-01-01T00:00:00.000012Z) is not within" in (
        letters[0].detail)


def test_a_far_ahead_event_confirmed_by_the_next_one_is_admitted_in_order() -> None:
    """A real gap: the next event is within the horizon of the held one (or beyond it), so
    both are admitted, in arrival order — the answer is the one without a horizon."""
    text = " = ((all_dup(A); all_dup(B))_50us)_all_pairs"
    trace = trace_of("a1@10 b1@12 a2@500 b2@540 a3@700 a4@1000 b3@1010 b4@1011")
    engine, letters = engine_with(text, horizon=100)
    assert run(engine, trace) == both(text, trace) and letters == []
    # The last event cannot be confirmed: refused, unless the end of the trace reaches it.
    engine, letters = engine_with(text, horizon=100)
    assert run(engine, trace_of("a1@10 a5@900")) == [] and [d.reason for d in letters] == [
        "future"]
    assert "no event came after it to confirm the jump" in letters[0].detail
    engine, letters = engine_with(text, horizon=100)
    engine.push(trace_of("a1@10")[0])
    engine.push(trace_of("a5@900")[0])
    assert engine.close(900) == [] and letters == []  # admitted: the trace ends at 900
    # A clock (advance) within the horizon before the held event confirms it too.
    engine, letters = engine_with(text, horizon=100)
    engine.admitted = []
    for e in trace_of("a1@10 b5@900"):
        engine.push(e)
    engine.advance(799)
    assert [e.id for e in engine.admitted] == ["a1"]
    engine.advance(800)
    assert [e.id for e in engine.admitted] == ["a1", "b5"]
    assert engine.close() == [] and letters == []
    # A typo, then a real jump: the typo is refused, the jump held and confirmed in turn.
    engine, letters = engine_with(text, horizon=100)
    assert run(engine, trace_of("a1@10 b9@9999999 a2@500 b2@520")) == [("a2", "b2")]
    assert [(d.reason, d.event.id if d.event else None) for d in letters] == [("future", "b9")]
    # A redelivery of the held event (its copy at its time) confirms nothing.
    engine, letters = engine_with(text, horizon=100)
    run(engine, trace_of("a1@10 b9@5000 b9@5000 b1@20"))
    assert [(d.reason, d.event.id if d.event else None) for d in letters] == [
        ("duplicate", "b9"), ("future", "b9")]


HOUR = DAY // 24
TYPO = " = ((all_dup(A); all_dup(B))_1h)_all_pairs"


def _at(text: str) -> list[Event]:
    """``"a1@0 b2@365d b2@60s"`` → events one source, times from a base instant (d, h, s)."""
    units = {"d": DAY, "h": HOUR, "s": 1_000_000}
    trace = []
    for seq, token in enumerate(text.split()):
        ident, _, at = token.partition("@")
        trace.append(Event(ident, "s", ident[0], DAY + int(at[:-1]) * units[at[-1]], seq))
    return trace


def test_a_corrected_resend_of_the_held_event_refuses_it_and_is_admitted() -> None:
    """A typo'd year, then the source resends the event (same source and id) with the right
    time: the resend decides like any other event — back near the old newest time, so the
    held one is the typo (`future`) and the resend is admitted. It used to be refused as a
    `duplicate` of the held one, which then died too: the composite was lost."""
    engine, letters = engine_with(TYPO, horizon=DAY)
    assert run(engine, _at("a1@0s b2@365d b2@60s x3@120s")) == [("a1", "b2")]
    assert [(d.reason, d.event.time if d.event else None) for d in letters] == [
        ("future", DAY + 365 * DAY)]
    assert "and the next event ('b2' at 1970-01-02T00:01:00Z, a copy of it) is not within 1d" in (
        letters[0].detail)


def test_an_exact_copy_of_the_held_event_decides_nothing() -> None:
    """A redelivery (same source, id and time) is no evidence of where the stream is: a
    `duplicate`, and the held event waits for the next one — else a typo delivered twice would
    confirm itself and make the rest of the trace late."""
    engine, letters = engine_with(TYPO, horizon=DAY)
    assert run(engine, _at("a1@0s b2@365d b2@365d b3@60s")) == [("a1", "b3")]
    assert [(d.reason, d.event.time if d.event else None) for d in letters] == [
        ("duplicate", DAY + 365 * DAY), ("future", DAY + 365 * DAY)]
    assert "is held (beyond the horizon) already" in letters[0].detail
    # A real jump delivered twice is still confirmed by what follows it.
    engine, letters = engine_with(TYPO, horizon=DAY)
    assert run(engine, _at("a1@0s a2@10d a2@10d b3@241h")) == [("a2", "b3")]
    assert [d.reason for d in letters] == ["duplicate"]


@pytest.mark.parametrize("copy", ["239h", "250h"])
def test_a_copy_near_the_held_event_confirms_it_and_is_the_duplicate(copy: str) -> None:
    """A resend within the horizon before the held event's time, or after it, says the stream
    is there: the held event is admitted, the copy is its `duplicate` (not `late`, which a copy
    an hour before would otherwise be)."""
    engine, letters = engine_with(TYPO, horizon=DAY)
    engine.admitted = []
    assert run(engine, _at(f"a1@0s a2@240h a2@{copy} b3@241h")) == [("a2", "b3")]
    assert [e.id for e in engine.admitted] == ["a1", "a2", "b3"]
    assert [(d.reason, d.event.time if d.event else None) for d in letters] == [
        ("duplicate", _at(f"a2@{copy}")[0].time)]
    assert "was already admitted" in letters[0].detail


def _cancellations(days: list[float], customers: str) -> list[Event]:
    return [Event(f"c{i}", "urn:orders", "order.cancelled", int(d * DAY), i,
                  {"customer": customer}) for i, (d, customer) in enumerate(zip(days, customers,
                                                                               strict=True))]


def test_p2_over_gaps_of_days_loses_nothing_with_the_default_horizon() -> None:
    """P2 (two cancellations by one customer within 4 weeks) over cancellations days apart:
    with the horizon measured from the newest admitted time and a refused event not moving it,
    the first gap of more than a day dead-lettered the rest of the trace (P2 gave nothing)."""
    doc = parse(Path("examples/logistics/profiles.eva").read_text())
    trace = _cancellations([0, 3, 4, 9, 9.5, 30], "ABABCC")
    expected = signature(evaluate(doc, trace, profiles=["P2"]))
    assert len(expected) == 3
    letters: list[DeadLetter] = []
    got = replay(doc, trace, profiles=["P2"], config=EngineConfig(horizon=DAY),
                 dead_letter=letters.append, until=30 * DAY)
    assert signature(got) == expected and letters == []


def test_a_typo_in_the_middle_of_the_logistics_day_is_refused_and_changes_nothing() -> None:
    """A year-9999 typo among the paper's events: held, refused by the next event (`future`),
    and the day's answer and work are those of the day without it."""
    from eva.events import from_cloudevent
    from examples.logistics.generate import day

    doc = parse(Path("examples/logistics/profiles.eva").read_text())
    events = [from_cloudevent(e, i) for i, e in enumerate(day(7))]
    typo = changed(events[100], id="typo", time=MAX_TIME - DAY)
    expected = signature(replay(doc, events, config=EngineConfig(horizon=DAY)))
    letters: list[DeadLetter] = []
    engine = Engine(EngineConfig(horizon=DAY), letters.append)
    engine.add_document(doc)
    got = [n for e in [*events[:100], typo, *events[100:]] for n in engine.push(e)]
    got += engine.close()
    assert signature(got) == expected
    assert [(d.reason, d.event.id if d.event else None) for d in letters] == [("future", "typo")]


# ---------------------------------------------------------------- clock-driven work


def _logistics(gap_days: float | None, profiles: str) -> tuple[int, int]:
    """(notifications, instants processed) of the logistics day, with one more event that
    long after its end."""
    from eva.events import from_cloudevent
    from examples.logistics.generate import day

    events = [from_cloudevent(e, i) for i, e in enumerate(day(7))]
    if gap_days is not None:
        last = max(e.time for e in events)
        events.append(changed(events[-1], id="gap", seq=len(events),
                              time=last + int(gap_days * DAY)))
    engine = Engine(EngineConfig())
    engine.add_document(parse(profiles))
    notes = sum(len(engine.push(e)) for e in events) + len(engine.close())
    return notes, engine.instants


def test_a_long_quiet_gap_costs_what_it_reports_not_its_ticks() -> None:
    """The paper's profiles across a quiet year: P6's half-hour ticks find no truck position
    within 30 min and P3's daily tick only extends a first_dup list, so their ticks are
    skipped; P5 reports an absence every day (a shift tick, then its anchored negation's
    deadline: two instants per report). Before, the year cost 17,520 half-hour instants."""
    profiles = Path("examples/logistics/profiles.eva").read_text()
    notes, instants = _logistics(None, profiles)
    gap_notes, gap_instants = _logistics(365, profiles)
    assert gap_notes - notes == 365
    assert gap_instants - instants <= 2 * (gap_notes - notes) + 10


def test_a_unique_negation_stops_ticking_after_its_report() -> None:
    """((not Load)_2h)_unique_pairs reports once; before, it stepped the 1 s clock through
    the whole gap (2.6 million instants for 30 days)."""
    profiles = 'class Load = type == "goods.pickup"\nprofile N = ((not Load)_2h)_unique_pairs\n'
    notes, instants = _logistics(None, profiles)
    gap_notes, gap_instants = _logistics(30, profiles)
    assert gap_notes == notes and gap_instants - instants <= 2
    # all_pairs reports every tick once the span has passed: the work is what it reports.
    all_pairs = profiles.replace("unique_pairs", "all_pairs").replace("2h", "1s")
    notes, instants = _logistics(None, all_pairs)
    gap_notes, gap_instants = _logistics(0.01, all_pairs)
    assert gap_instants - instants <= gap_notes - notes + 2


@st.composite
def gappy_traces(draw: st.DrawFn) -> list[Event]:
    """Traces with long quiet gaps between short bursts, so skipped ticks are many."""
    t, out = 10, []
    for i in range(draw(st.integers(0, 14))):
        t += draw(st.sampled_from([0, 1, 2, 3, 17, 40]))
        kind = draw(st.sampled_from("abc"))
        out.append(Event(f"{kind}{i}", "s", kind, t, i, {"k": draw(st.sampled_from([1, 2]))}))
    return out


@settings(max_examples=150, deadline=None)
@given(documents(), gappy_traces())
def test_skipping_ticks_across_quiet_gaps_changes_no_answer(doc: object,
                                                            trace: list[Event]) -> None:
    from eva import ast

    assert isinstance(doc, ast.Document)
    expected = signature(evaluate(doc, trace, tick=1))
    for config in (EngineConfig(tick=1), EngineConfig(tick=1, sweep=1)):
        assert signature(replay(doc, trace, config=config)) == expected


# ---------------------------------------------------------------- the command line


def test_replay_over_every_kind_of_bad_line_exits_0_with_one_letter_per_bad_line(
        tmp_path: Path) -> None:
    def event(ident: str, second: int, **extra: str) -> bytes:
        return line(**extra).replace('"id": "a"', f'"id": "{ident}"').replace(
            "00:00:00Z", f"00:00:{second:02d}Z").encode()

    lines = [
        event("g1", 1),
        event("u1", 2).replace(b'"u1"', b'"u\xff1"'),
        event("d1", 3, data="[" * 1000 + "]" * 1000),
        event("i1", 4, data="9" * 5000),
        event("t1", 5).replace(b"2026-01-01T00:00:05Z", b"0001-01-01T00:30:00+01:00"),
        event("t2", 6).replace(b"2026-01-01T00:00:06Z", b"9999-12-31T23:30:00-01:00"),
        event("f1", 7).replace(b"2026-", b"2126-"),
        event("g1", 8),
        event("r1", 9).replace(b"2026-01-01T00:00:09Z", b"20260101T000009Z"),
        event("g2", 10),
    ]
    reasons = ["malformed"] * 5 + ["future", "duplicate", "malformed"]
    profiles = tmp_path / "p.eva"
    profiles.write_text('class T = type == "t"\nprofile P = T\n')
    events = tmp_path / "e.jsonl"
    events.write_bytes(b"\n".join(lines) + b"\n")
    runner = CliRunner()
    for source, stdin in ((str(events), None), ("-", events.read_bytes())):
        letters = tmp_path / "dead.jsonl"
        result = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", source,
                                     "--dead-letter", str(letters)], input=stdin)
        assert result.exit_code == 0, result.output
        out = [json.loads(x) for x in result.stdout.splitlines()]
        assert [o["data"]["constituents"] for o in out] == [["g1"], ["g2"]]
        records = [json.loads(x) for x in letters.read_text(encoding="utf-8").splitlines()]
        assert [r["reason"] for r in records] == reasons
        assert [r["detail"].split(":")[0] for r in records if "raw" in r] == [
            "line 2", "line 3", "line 4", "line 5", "line 6", "line 9"]
        assert "\\xff" in records[0]["raw"]  # the bytes as they were, readable
        assert [r["event"]["id"] for r in records if "event" in r] == ["f1", "g1"]


def test_replay_horizon_option(tmp_path: Path) -> None:
    profiles = tmp_path / "p.eva"
    profiles.write_text('class T = type == "t"\nprofile P = T\n')
    events = tmp_path / "e.jsonl"
    events.write_text(line() + "\n" + line().replace('"a"', '"b"').replace("2026-", "2027-")
                      + "\n")
    runner = CliRunner()
    for option, composites in (("1d", 1), ("400d", 2), ("inf", 2)):
        result = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events",
                                     str(events), "--horizon", option])
        assert result.exit_code == 0 and len(result.stdout.splitlines()) == composites
    for bad in ("0s", "soon"):
        result = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events",
                                     str(events), "--horizon", bad])
        assert result.exit_code == 2 and "--horizon" in result.output


def test_replay_keeps_gaps_of_days_and_refuses_a_typo_with_the_default_horizon(
        tmp_path: Path) -> None:
    """`evamed replay` (horizon 1d) and the paper's P2 over cancellations days apart: every
    jump is confirmed by the next event, the last by --until, so P2 reports what it reports
    without a horizon; a year-9999 typo in the middle is refused (`future`) and changes
    nothing. Before, the first gap of more than a day dead-lettered the rest of the trace."""
    trace = _cancellations([0, 3, 4, 9, 9.5, 30], "ABABCC")
    lines = [json.dumps(to_cloudevent(e)) for e in trace]
    typo = json.dumps(to_cloudevent(changed(trace[2], id="typo",
                                            time=parse_time("9999-03-02T00:00:00Z"))))
    events = tmp_path / "e.jsonl"
    events.write_text("\n".join([*lines[:2], typo, *lines[2:]]) + "\n")
    args = ["replay", "--profiles", "examples/logistics/profiles.eva", "--profile", "P2",
            "--events", str(events)]
    result = CliRunner().invoke(app, [*args, "--until", format_time(30 * DAY)])
    assert result.exit_code == 0, result.output
    assert [json.loads(x)["data"]["constituents"] for x in result.stdout.splitlines()] == [
        ["c0", "c2"], ["c1", "c3"], ["c4", "c5"]]
    letters = [json.loads(x) for x in result.stderr.splitlines()]
    assert [(r["reason"], r["event"]["id"]) for r in letters] == [("future", "typo")]
    # Without --until nothing confirms the last jump: a `future` letter says how to keep it.
    result = CliRunner().invoke(app, args)
    assert len(result.stdout.splitlines()) == 2
    letters = [json.loads(x) for x in result.stderr.splitlines()]
    assert [(r["reason"], r["event"]["id"]) for r in letters] == [("future", "typo"),
                                                                  ("future", "c5")]
    assert "raise the horizon" in letters[1]["detail"]
