"""The admission rules (eva/admission.py), the one module every path takes events in with:
the reorder buffer, the duplicate memory, the horizon, a trial that commits or leaves no trace,
and the Redis source's merge of several streams (adapters/redis_source.py)."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.redis_source import Merge
from eva.admission import HOLD, Admission, Reason, Reorder, Rules, Stream, Trial, too_large
from eva.events import DeadLetter, Event
from tests.strategies import documents, traces


def ev(ident: str, t: int, source: str = "s") -> Event:
    return Event(ident, source, "a", t)


def within(lateness: int) -> st.SearchStrategy[list[int]]:
    """Arrival-ordered times, each at most ``lateness`` older than the newest before it."""
    def build(steps: list[tuple[int, int]]) -> list[int]:
        times, newest = [], 0
        for forward, back in steps:
            newest += forward
            times.append(newest - min(back, lateness))
        return times
    return st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2 * lateness)),
                    max_size=60).map(build)


@settings(max_examples=200, deadline=None)
@given(times=within(4), capacity=st.sampled_from([1, 3, 1000]))
def test_the_reorder_buffer_gives_out_in_time_order_and_loses_nothing_within_the_lateness(
        times: list[int], capacity: int) -> None:
    """Items within the lateness of the newest taken come out in (time, arrival) order, each
    once — all of them when the buffer is big enough; with a small one the oldest are given out
    early, and what then falls behind is said (``behind``) rather than taken out of order."""
    buffer: Reorder[int] = Reorder(4, capacity)
    out: list[int] = []
    refused = []
    for n, t in enumerate(times):
        if buffer.behind(t):
            refused.append(n)
            continue
        out += buffer.put(t, n)
    out += buffer.drain()
    taken = [n for n in range(len(times)) if n not in refused]
    assert sorted(out) == taken
    assert out == sorted(out, key=lambda n: (times[n], n))
    if capacity == 1000:
        assert refused == []


def test_the_watermark_is_the_newest_less_the_lateness_or_an_advance_whichever_is_later() -> None:
    buffer: Reorder[str] = Reorder(10)
    assert buffer.watermark is None
    assert buffer.put(100, "a") == [] and buffer.watermark == 89
    assert buffer.put(95, "b") == [] and buffer.put(111, "c") == ["b", "a"]
    assert buffer.watermark == 100 and buffer.behind(100) == ""  # its instant may still grow
    assert "before" in buffer.behind(99)
    assert buffer.advance(120) == ["c"] and buffer.watermark == 120
    assert "advance" in buffer.behind(120) and buffer.behind(121) == ""


def test_a_full_buffer_gives_out_its_oldest_and_says_so() -> None:
    buffer: Reorder[str] = Reorder(100, capacity=2)
    assert buffer.put(10, "a") == [] and buffer.put(11, "b") == []
    assert buffer.put(12, "c") == ["a"] and buffer.forced == 1
    assert "the reorder buffer was full: 2 events" in buffer.behind(9)


def stream_of(rules: Rules) -> tuple[Stream, list[DeadLetter]]:
    letters: list[DeadLetter] = []
    return Stream(rules, letters.append), letters


def test_a_stream_admits_within_the_lateness_and_refuses_beyond_with_the_reason() -> None:
    stream, letters = stream_of(Rules(lateness=5))
    got = [e.id for e in [*stream.push(ev("a", 10)), *stream.push(ev("b", 7)),
                          *stream.push(ev("c", 4)), *stream.push(ev("a", 12)),
                          *stream.push(ev("d", 16)), *stream.close()]]
    assert got == ["b", "a", "d"]
    assert [(d.reason, d.event.id if d.event else "") for d in letters] == [
        ("late", "c"), ("duplicate", "a")]
    assert letters[0].detail.endswith("the newest event time 1970-01-01T00:00:00.000010Z "
                                      "minus the allowed lateness 5us")
    assert stream.origin == 10 - 5 - 1


def test_a_far_ahead_event_is_held_until_the_next_decides_without_a_clock() -> None:
    """Replay's horizon: held, then admitted when the next event is near it (the stream moved)
    or refused when the next is back near the old time (a typo)."""
    stream, letters = stream_of(Rules(horizon=100))
    out = stream.push(ev("a", 10))
    assert stream.push(ev("typo", 5000)) == []
    out += stream.push(ev("b", 12))
    assert [(d.reason, d.event.id if d.event else "") for d in letters] == [("future", "typo")]
    assert stream.push(ev("gap", 900)) == []  # held in turn
    out += stream.push(ev("next", 950)) + stream.close()
    assert [e.id for e in out] == ["a", "b", "gap", "next"]


def test_with_a_clock_the_horizon_is_measured_from_it_and_refuses_at_once() -> None:
    """The mediator's door: nothing can confirm a time a day ahead of its clock."""
    now = 1_000_000
    admission = Admission(Rules(horizon=100), clock=lambda: now)
    assert admission.judge(ev("a", now + 100)) is None
    refused = admission.judge(ev("b", now + 101))
    assert refused is not None and refused is not HOLD and refused.reason is Reason.FUTURE
    assert "ahead of the mediator's clock" in refused.detail
    assert admission.check_advance(now + 101) and not admission.check_advance(now + 100)
    assert Admission(Rules(horizon=100)).judge(ev("c", 5)) is None


def test_a_trial_leaves_no_trace_until_it_commits() -> None:
    """The door judges a message, appends it, then commits: a message that could not be
    appended leaves neither its ids nor its newest time behind."""
    admission = Admission(Rules(lateness=0))
    trial = Trial(admission)
    assert trial.judge(ev("a", 10)) is None
    refused = trial.judge(ev("a", 11))
    assert refused is not None and refused.reason is Reason.DUPLICATE
    refused = trial.judge(ev("b", 9))
    assert refused is not None and refused.reason is Reason.LATE
    assert admission.newest is None and ("s", "a") not in admission.ids
    assert Trial(admission).judge(ev("b", 9)) is None  # the failed message left nothing
    trial.commit()
    assert admission.newest == 10 and ("s", "a") in admission.ids


def test_each_lane_has_its_lateness_and_size_limit() -> None:
    rules = Rules(lateness=2, lanes={"plant": 10}, max_bytes=100, sizes={"plant": 1000})
    admission = Admission(rules)
    admission.take(ev("a", 100))
    assert admission.judge(ev("b", 95), "publish") is not None
    assert admission.judge(ev("c", 95), "plant") is None
    assert rules.longest == 10
    refused = too_large(101, rules.max_bytes_of("publish"))
    assert refused is not None and "the limit is 100 (max_event_bytes)" in refused.detail
    assert too_large(101, rules.max_bytes_of("plant")) is None


def test_duplicates_are_remembered_for_the_window_then_forgotten() -> None:
    stream, letters = stream_of(Rules(lateness=0, remember=10))
    for i, t in enumerate([1, 2, 30, 31, 60]):
        stream.push(ev(f"e{i}", t))
    stream.push(ev("e3", 61))  # within the window: refused
    stream.push(ev("e0", 62))  # its original was two rotations ago: forgotten
    assert [(d.reason, d.event.id if d.event else "") for d in letters] == [("duplicate", "e3")]


def test_every_reason_is_what_the_command_line_offers() -> None:
    from mediator.cli.deadletters import REASONS

    assert tuple(str(r) for r in Reason) == REASONS


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10_000), streams=st.integers(1, 6), count=st.integers(1, 7))
def test_the_redis_merge_hands_over_several_streams_in_time_order_across_reads(
        seed: int, streams: int, count: int) -> None:
    """Streams of increasing times (a backlog each), read ``count`` entries of the laggard at a
    time, as RedisSource reads them: every entry handed over once, in time order."""
    rng = random.Random(seed)
    backlog = {f"s{n}": sorted(rng.randrange(1000) for _ in range(rng.randrange(20)))
               for n in range(streams)}
    read = dict.fromkeys(backlog, 0)
    merge = Merge(backlog)
    out = []
    while True:
        laggard = merge.next()
        names = [laggard] if laggard is not None else list(backlog)
        if laggard is None and all(read[s] == len(backlog[s]) for s in backlog):
            break
        for name in names:
            chunk = backlog[name][read[name]:read[name] + count]
            read[name] += len(chunk)
            merge.add(name, [(t, f"{name}/{t}", name, "") for t in chunk], len(chunk) == count)
        out += merge.due()
    out += merge.due()
    assert [t for t, *_ in out] == sorted(t for ts in backlog.values() for t in ts)


@settings(max_examples=60, deadline=None)
@given(doc=documents(), trace=traces(max_size=30, sources=("s", "t")), seed=st.integers(0, 999),
       lateness=st.sampled_from([1, 3, 8]))
def test_replay_of_a_trace_disordered_within_the_lateness_is_replay_of_it_in_order(
        doc: Any, trace: list[Event], seed: int, lateness: int) -> None:
    """``evamed replay --lateness L`` over arrivals each at most L older than the newest before
    them (two sources, many equal times) prints, composites and dead letters alike, what replay
    without lateness prints over the trace in time order: the reorder buffer restores it."""
    import io

    from eva.engine import EngineConfig
    from eva.events import to_cloudevent
    from mediator.cli import runs

    rng = random.Random(seed)
    delay = {t: rng.randrange(lateness + 1) for t in {e.time for e in trace}}
    arrived = sorted(trace, key=lambda e: (e.time + delay[e.time], e.time, e.seq))

    def replayed(events: list[Event], late: int) -> tuple[str, str]:
        out, dead = io.StringIO(), io.StringIO()
        lines = [(n, json.dumps(to_cloudevent(e)).encode()) for n, e in enumerate(events, 1)]
        runs.replay_plain(doc, None, iter(lines), EngineConfig(allowed_lateness=late),
                          None, out, runs.DeadLetters(dead))
        return out.getvalue(), dead.getvalue()

    # The clock starts just before the first admitted time less the lateness (time classes
    # tick from there): each run starts with an event no profile sees, placed so that both
    # clocks start at the same instant.
    if not trace:
        return
    first = trace[0].time
    ordered = replayed([Event("start", "x", "zzz", first - lateness), *trace], 0)
    assert replayed([Event("start", "x", "zzz", first), *arrived], lateness) == ordered
