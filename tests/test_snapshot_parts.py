"""Engine state by partition (issue 15.2): a core (``snapshot_core``) and the records of the
partitions changed since the last call (``take_changed``), read back lazily (``restore_core``)
— what the Spark job keeps in its state store. Exact to the event, like ``restore(snapshot())``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva import ast
from eva.engine import Engine, EngineConfig, _record
from eva.events import DeadLetter, Event
from eva.notify import to_cloudevent
from eva.parser import parse
from eva.printer import expr_text
from eva.semantics import Notification, partition_key
from eva.snapshot import (
    SnapshotError,
    _record_bytes,
    partition_id,
    restore,
    restore_core,
    snapshot,
    snapshot_core,
    take_changed,
)
from tests.strategies import CLASSES, expressions, traces

Store = dict[str, bytes]
KEYS = [1, 2, "x", "y", 2.5, True, {"a": 1}, [1, "b"], 10**20]
"""``per`` values of every kind a key is made of (``partition_key``): their ids must be stable."""


def _apply(store: Store, changed: dict[str, bytes | None]) -> None:
    """What the Spark job does with ``take_changed``: write the records, delete the None ones."""
    for ident, record in changed.items():
        if record is None:
            store.pop(ident, None)
        else:
            store[ident] = record


def _check_store(engine: Engine, store: Store) -> None:
    """The store holds a record for exactly the partitions the engine holds, each equal to the
    partition's state now (no change missed) — those read, that is; the rest are as read."""
    held = {partition_id(p.index, key): (p, key) for p in engine._profiles.values()
            for key in [*p.partitions, *p.unloaded]}
    assert set(store) == set(held)
    for ident, (p, key) in held.items():
        if key in p.partitions:
            assert store[ident] == _record_bytes(ident, p.budget, _record(p.partitions[key]))


@st.composite
def keyed_documents(draw: st.DrawFn) -> ast.Document:
    """One or two profiles over CLASSES, most with ``per``, some end-of-interval."""
    lines = []
    for name in draw(st.sampled_from([["P"], ["P", "Q"]])):
        per = " per data.k" if draw(st.integers(0, 3)) else ""
        evaluation = " evaluate end_of_interval" if draw(st.integers(0, 3)) == 0 else ""
        lines.append(f"profile {name}{per}{evaluation} = {expr_text(draw(expressions(3)))}\n")
    return parse(CLASSES + "".join(lines))


@st.composite
def keyed_traces(draw: st.DrawFn) -> list[Event]:
    sources = draw(st.sampled_from([("s",), ("s", "t")]))
    return [Event(e.id, e.source, e.type, e.time, e.seq, {"k": draw(st.sampled_from(KEYS))})
            for e in draw(traces(sources=sources))]


def _run(engine: Engine, events: list[Event]) -> list[Notification]:
    return [n for e in events for n in engine.push(e)]


def _answers(notes: list[Notification]) -> list[Any]:
    return [(to_cloudevent(n), n.emitted) for n in notes]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(keyed_documents(), keyed_traces(), st.lists(st.integers(0, 24), max_size=3),
       st.lists(st.integers(0, 24), max_size=4), st.sampled_from([0, 2]),
       st.sampled_from([0, 3, 4096]), st.sampled_from([4, 1_000_000]))
def test_a_core_and_the_changed_records_continue_exactly(
        doc: ast.Document, trace: list[Event], cuts: list[int], takes: list[int], lateness: int,
        sweep: int, cap: int) -> None:
    """Random profiles (every operator, ``per`` over keys of every kind, negations, time
    classes), random traces cut at random points: an engine restored from its core and the
    records take_changed gave (None applied as deletes) answers exactly as the uninterrupted
    one — and so does ``restore(snapshot())`` of such an engine. Sweeps (every 3 events) and
    a state cap of 4 make partitions collected, dropped and evicted between the cuts."""
    config = EngineConfig(tick=3, allowed_lateness=lateness, sweep=sweep, state_cap=cap)
    end = max((e.time for e in trace), default=None)
    letters: list[DeadLetter] = []
    whole = Engine(config, letters.append)
    whole.add_document(doc)
    expected = _run(whole, trace) + whole.close(end)
    expected_letters = [(d.reason, d.detail) for d in letters]

    letters.clear()
    engine = Engine(config, letters.append)
    engine.add_document(doc)
    store: Store = {}
    got: list[Notification] = []
    branched = False
    for i, event in enumerate(trace):
        if i in takes:
            _apply(store, take_changed(engine))
            _check_store(engine, store)
        if i in cuts:
            _apply(store, take_changed(engine))
            _check_store(engine, store)
            core = snapshot_core(engine)
            if not branched:  # the whole snapshot of an engine restored from a core
                branched = True
                twin = restore(snapshot(restore_core(core, dict(store).get)))
                rest = _run(twin, trace[i:]) + twin.close(end)
                assert _answers(got + rest) == _answers(expected)
            engine = restore_core(core, store.get, letters.append)
            assert take_changed(engine) == {}  # nothing read counts as changed
        got += engine.push(event)
    got += engine.close(end)
    assert _answers(got) == _answers(expected)
    assert [(d.reason, d.detail) for d in letters] == expected_letters
    _apply(store, take_changed(engine))
    _check_store(engine, store)


def _many_keys(count: int = 50) -> tuple[ast.Document, list[Event]]:
    doc = parse('class A = type == "a"\nclass B = type == "b"\n'
                "profile P per data.k = ((all_dup(A); all_dup(B))_inf)_all_pairs\n"
                "profile N per data.k = ((not A)_2s)_all_pairs\n")
    trace = [Event(f"e{i}", "s", "ab"[i % 3 == 2], (i + 1) * 1_000_000, i,
                   {"k": f"k{i * 7 % count}"}) for i in range(4 * count)]
    return doc, trace


def test_a_push_changes_the_records_of_its_key_only() -> None:
    """A ``per`` profile over 50 keys: each event's take_changed holds the record of its own
    key's partition at most (none when the partition is not kept: a B with no A before it) —
    before and after a restore from a core, where reading a record is no change."""
    _, trace = _many_keys()
    doc = parse('class A = type == "a"\nclass B = type == "b"\n'
                "profile P per data.k = ((all_dup(A); all_dup(B))_inf)_all_pairs\n")
    engine = Engine(EngineConfig(sweep=0))
    engine.add_document(doc)
    store: Store = {}
    assert take_changed(engine) == {}
    for i, event in enumerate(trace):
        if i == len(trace) // 2:
            engine = restore_core(snapshot_core(engine), store.get)
        engine.push(event)
        changed = take_changed(engine)
        mine = partition_id(0, partition_key(event.data["k"]))
        assert set(changed) <= {mine}
        if event.type == "a":  # an anterior element is kept: its partition is
            assert changed[mine] is not None
        _apply(store, changed)
    assert len(store) == 50


def test_partitions_read_are_those_an_event_needs() -> None:
    """A restored core reads no partition until one is needed: of P, those of the keys of
    the events processed; of the clock-driven N, those too and those its timers name; a core
    is written without reading any; a sweep reads them all."""
    doc, trace = _many_keys()
    engine = Engine(EngineConfig(sweep=0, tick=1_000_000))
    engine.add_document(doc)
    store: Store = {}
    _run(engine, trace[:100])
    _apply(store, take_changed(engine))
    read: list[str] = []

    def load(ident: str) -> bytes | None:
        read.append(ident)
        return store.get(ident)

    restored = restore_core(snapshot_core(engine), load)
    assert read == []
    timed = {partition_id(1, key) for _, _, _, key in restored._timers}
    event = Event("late-a", "s", "a", trace[99].time + 1, 100, {"k": "k3"})
    restored.push(event)
    restored.advance(event.time)  # processed (a clock-driven engine buffers it till then)
    last = trace[99].data["k"]  # buffered before the core was taken: processed now
    assert {i for i in read if i.startswith("[0,")} == {_id(0, last), _id(0, "k3")}
    assert {i for i in read if i.startswith("[1,")} <= timed | {_id(1, last), _id(1, "k3")}
    count = len(read)
    assert snapshot_core(restored) and len(read) == count
    restored.config.sweep = 1
    restored._next_sweep = 1  # due at the next event
    restored.push(Event("next", "s", "c", event.time + 1, 101, {"k": "k3"}))
    restored.advance(event.time + 1)
    assert sorted(read) == sorted(set(read)) and set(read) == set(store)


def _id(index: int, key: str) -> str:
    """The id of profile ``index``'s partition of a string ``key``."""
    return partition_id(index, partition_key(key))


def test_first_takes_and_removed_profiles() -> None:
    """An engine's first take gives every partition it holds (the store starts empty), after
    ``restore`` too; one restored from a core, nothing. A removed profile's partitions are
    deleted, those never read included."""
    doc, trace = _many_keys(10)
    engine = Engine(EngineConfig())
    engine.add_document(doc)
    _run(engine, trace[:20])
    held = {partition_id(p.index, key) for p in engine._profiles.values() for key in p.partitions}
    store: Store = {}
    first = take_changed(engine)
    assert set(first) == held and None not in first.values()
    _apply(store, first)
    again = take_changed(restore(snapshot(engine)))
    assert again == first
    restored = restore_core(snapshot_core(engine), store.get)
    assert take_changed(restored) == {}
    restored.push(Event("x", "s", "a", trace[19].time + 1, 20, {"k": "k1"}))
    assert restored.remove_profile("P")
    gone = take_changed(restored)
    assert {i for i, r in gone.items() if r is None} == {i for i in held if i.startswith("[0,")}
    _apply(store, gone)
    assert all(i.startswith("[1,") for i in store)


def _restored(store: Store, change: Callable[[Store], None]) -> tuple[Engine, Event]:
    doc, trace = _many_keys(10)
    engine = Engine(EngineConfig(sweep=0))
    engine.add_document(doc)
    _run(engine, trace[:20])
    _apply(store, take_changed(engine))
    core = snapshot_core(engine)
    change(store)
    return restore_core(core, store.get), Event("x", "s", "a", trace[19].time + 1, 20,
                                                 {"k": "k1"})


def _set(ident: str, data: bytes) -> Callable[[Store], None]:
    return lambda store: store.__setitem__(ident, data)


K1 = _id(0, "k1")
K2 = _id(0, "k2")
HEAD = b"evamed-partition 5\n"


@pytest.mark.parametrize(("change", "message"), [
    (lambda store: store.pop(K1),
     f"partition {K1}: the engine core lists it, but load gave no record"),
    (_set(K1, b"garbage"), "not an evamed partition record of format 5 (it starts with "
     "b'garbage')"),
    (_set(K1, HEAD + b"[1,2"), f"malformed partition record {K1}: JSONDecodeError"),
    (_set(K1, HEAD + b'["l",1,2,3]'), "its record holds [1, 2, 3], expected [value, state, "
     "created, number]"),
    (_set(K1, HEAD + b'["v",1,"builtins.eval","1"]'), "'builtins.eval' is not engine state"),
    (_set(K1, HEAD + b'["o",1,"eva.nodes.BinaryNode"]'), "record ['eva.nodes.BinaryNode'] does "
     "not match the class table"),
    (lambda store: store.__setitem__(K1, store[K2]), f"partition {K1}: its record is of "
     "partition 'k2'"),
    (lambda store: store.__setitem__(K1, store[_id(1, "k1")]),
     "partition 'k1': the state of a BinaryNode is a NegationState, expected a BinaryState"),
])
def test_a_malformed_record_is_refused_when_read(change: Callable[[Store], None],
                                                 message: str) -> None:
    """A record is read when its partition is first needed: anything but this version's
    record of that partition is a SnapshotError then, naming the partition; nothing is run."""
    engine, event = _restored({}, change)
    with pytest.raises(SnapshotError) as caught:
        engine.push(event)
        engine.advance(event.time)
    assert message in str(caught.value), str(caught.value)


def test_a_record_over_the_bound_is_neither_written_nor_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from eva import snapshot as module

    store: Store = {}
    engine, event = _restored(store, lambda _: None)
    size = len(store[K1]) - len(HEAD)
    monkeypatch.setattr(module, "MAX_STATE_BYTES", size - 1)
    with pytest.raises(SnapshotError, match=re.escape(f"partition {K1}: its record is {size:,} bytes")):
        engine.push(event)
        engine.advance(event.time)
    monkeypatch.setattr(module, "MAX_STATE_BYTES", 1_000_000)
    engine, event = _restored({}, lambda _: None)
    engine.push(event)
    engine.advance(event.time)
    monkeypatch.setattr(module, "MAX_STATE_BYTES", 50)
    with pytest.raises(SnapshotError, match=r"partition \[\d,.*\] is \d+ bytes of JSON, over "
                       "the 50 a snapshot may hold"):
        take_changed(engine)
    monkeypatch.setattr(module, "MAX_STATE_BYTES", 1_000_000)
    assert K1 in take_changed(engine)  # nothing was taken: the change is still reported


@pytest.mark.parametrize(("core", "message"), [
    (b"evamed-engine-snapshot 5\n", "not an evamed engine core (it starts with"),
    (b"evamed-engine-core 4\n", "engine core format '4'; this evamed reads format 5 only"),
    (b"evamed-engine-core 5\nnot zlib", "malformed engine core: not zlib data"),
])
def test_what_is_not_a_core_is_refused(core: bytes, message: str) -> None:
    with pytest.raises(SnapshotError) as caught:
        restore_core(core, lambda _: None)
    assert message in str(caught.value), str(caught.value)


def test_a_core_listing_bad_partition_keys_is_refused() -> None:
    import zlib

    from eva import snapshot as module

    doc, trace = _many_keys(3)
    engine = Engine(EngineConfig())
    engine.add_document(doc)
    _run(engine, trace[:5])
    text = json.loads(zlib.decompress(snapshot_core(engine).partition(b"\n")[2]))
    text["root"][text["root"].index("profiles") + 1][1][7] = ["l", None, ["l", 1]]
    forged = b"evamed-engine-core 5\n" + zlib.compress(json.dumps(text).encode())
    with pytest.raises(SnapshotError, match="snapshot of profile 'P': partition keys "
                       r"\[None, \[1\]\], expected a list of keys"):
        module.restore_core(forged, lambda _: None)


def test_timers_of_keys_of_different_kinds_at_one_instant() -> None:
    """A clock-driven ``per`` profile whose partitions' keys are of different kinds (a
    number's tuple, a JSON object's text) due at one instant: the timer queue compares their
    numbers, never the keys (it raised TypeError)."""
    doc = parse('class A = type == "a"\nprofile N per data.k = ((not A)_2s)_all_pairs\n')
    engine = Engine(EngineConfig())
    engine.add_document(doc)
    for i, key in enumerate([1, {"a": 1}, "x", [2]]):
        engine.push(Event(f"a{i}", "s", "a", 1_000_000, i, {"k": key}))
    notes = engine.close(6_000_000)
    assert {json.dumps(n.partition) for n in notes} == {'1', '{"a": 1}', '"x"', "[2]"}
