"""Engine snapshots: a restored engine continues exactly where the original stopped — what a
state store (the Spark job) and a restarted service rely on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva import ast
from eva.engine import Engine, EngineConfig
from eva.events import Event
from eva.notify import to_cloudevent
from eva.snapshot import SnapshotError, restore, snapshot
from tests.strategies import documents, traces


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(documents(), traces(), st.integers(0, 30), st.sampled_from([0, 2]), st.booleans())
def test_a_restored_engine_continues_exactly(doc: ast.Document, trace: list[Event], cut: int,
                                             lateness: int, twice: bool) -> None:
    """Every operator and parameter, partitions, clocks, buffered out-of-order events."""
    config = EngineConfig(tick=3, allowed_lateness=lateness)
    whole = Engine(config)
    whole.add_document(doc)
    expected = [n for e in trace for n in whole.push(e)] + whole.close()
    first = Engine(config)
    first.add_document(doc)
    got = [n for e in trace[:cut] for n in first.push(e)]
    second = restore(snapshot(first))
    if twice:
        second = restore(snapshot(restore(snapshot(second))))
    got += [n for e in trace[cut:] for n in second.push(e)]
    got += second.close(max((e.time for e in trace), default=None))
    assert [to_cloudevent(n) for n in got] == [to_cloudevent(n) for n in expected]
    assert [n.emitted for n in got] == [n.emitted for n in expected]


def test_a_snapshot_keeps_no_callback_and_the_original_goes_on() -> None:
    letters: list[object] = []
    engine = Engine(EngineConfig(), letters.append)
    data = snapshot(engine)
    assert isinstance(data, bytes) and engine.dead_letter == letters.append
    later: list[object] = []
    restored = restore(data, later.append)
    restored.malformed("x")
    assert len(later) == 1 and letters == []


def test_a_snapshot_restores_in_a_fresh_process(tmp_path: Path) -> None:
    """Spark restores in another worker than the one that wrote the snapshot: nothing the
    writer cached (attribute names per class) may be needed to read it."""
    from eva.parser import parse

    doc = parse('class A = type == "a"\nclass B = type == "b"\n'
                "profile S per data.k = ((all_dup(A); last_dup(B))_10s)_all_pairs\n")
    engine = Engine(EngineConfig())
    engine.add_document(doc)
    trace = [Event(f"e{i}", "s", "ab"[i % 2], 1_000_000 * i, i, {"k": i % 3}) for i in range(12)]
    for event in trace[:7]:
        engine.push(event)
    (tmp_path / "engine.bin").write_bytes(snapshot(engine))
    rest = [n for e in trace[7:] for n in engine.push(e)] + engine.close()
    script = (
        "import json, sys\n"
        "from eva.events import Event\n"
        "from eva.notify import to_cloudevent\n"
        "from eva.snapshot import restore\n"
        f"engine = restore(open({str(tmp_path / 'engine.bin')!r}, 'rb').read())\n"
        f"trace = [Event(f'e{{i}}', 's', 'ab'[i % 2], 1_000_000 * i, i, {{'k': i % 3}})"
        " for i in range(7, 12)]\n"
        "notes = [n for e in trace for n in engine.push(e)] + engine.close()\n"
        "print(json.dumps([to_cloudevent(n) for n in notes]))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == [to_cloudevent(n) for n in rest] and rest


def _forged(document: object, version: str = "5") -> bytes:
    """Bytes shaped like a snapshot: the version line, then compressed JSON records."""
    import zlib

    return f"evamed-engine-snapshot {version}\n".encode() + zlib.compress(
        json.dumps(document).encode())


def _engine_bytes() -> bytes:
    from eva.parser import parse

    engine = Engine(EngineConfig())
    engine.add_document(parse('class A = type == "a"\nprofile S per data.k = A\n'))
    engine.push(Event("e1", "s", "a", 1_000_000, 0, {"k": 1}))
    return snapshot(engine)


def test_a_snapshot_is_data_with_a_version() -> None:
    """Written as a version line and JSON records (no pickle): a reader needs no code from it."""
    import zlib

    data = _engine_bytes()
    head, _, body = data.partition(b"\n")
    assert head == b"evamed-engine-snapshot 5"
    assert set(json.loads(zlib.decompress(body))) == {"classes", "root"}


@pytest.mark.parametrize(("data", "message"), [
    (_forged({"classes": {}, "root": None}, "4"), "format '4'; this evamed reads format 5"),
    (_forged({"classes": {}, "root": None}, "6"), "format '6'; this evamed reads format 5"),
    (b"\x80\x05garbage", "pickled engine (snapshot format 1"),
    (b"PK\x03\x04", "not an evamed engine snapshot"),
    (_forged({"classes": {"posix.system": []}, "root": None}), "'posix.system' is not engine state"),
    (_forged({"classes": {}, "root": ["v", 0, "builtins.eval", "1"]}),
     "'builtins.eval' is not engine state"),
    (_forged({"classes": {}, "root": ["k", "subprocess.Popen"]}), "unknown record ['k']"),
    (_forged({"classes": {"eva.state.Budget": ["__class__"]}, "root": None}),
     "are not those of eva.state.Budget"),
    (_forged({"classes": {"eva.nodes.BinaryNode": []}, "root": None}),
     "'eva.nodes.BinaryNode' is not engine state"),
    (_forged({"classes": {}, "root": ["r", 7]}), "reference [7] to nothing"),
    (_forged({"classes": {}, "root": ["zz"]}), "unknown record ['zz']"),
    (_forged({"classes": {}, "root": ["t", 1]}), "holds a tuple, not an engine's state"),
    (_forged({"classes": {}, "root": ["d"]}), "malformed engine snapshot: KeyError: 'config'"),
    (_forged({"classes": {}, "root": ["v", 0, "eva.events.Event", 1]}),
     "malformed engine snapshot: TypeError"),
    (b"evamed-engine-snapshot 5\nnot zlib", "malformed engine snapshot: not zlib data"),
    (_forged({"classes": {}, "root": None})[:-4], "compressed data is truncated"),
    (_forged({"classes": {}, "root": None}) + b"junk", "4 bytes follow the compressed data"),
    # issue 11 review: what escaped as another exception, or only by luck as a SnapshotError
    (_forged({"classes": {}, "root": ["q", 10**30]}),
     "a deque bounded by 1000000000000000000000000000000, expected none or a size"),
    (_forged({"classes": {}, "root": ["q", -1]}), "a deque bounded by -1"),
    (_forged({"classes": {}, "root": ["q", "x"]}), "a deque bounded by 'x'"),
    # the flat records (issue 12)
    (_forged({"classes": {}, "root": ["O", 0, 1, [1, 0, 0]]}),
     "an occurrence of 2 fields, expected 5"),
    (_forged({"classes": {}, "root": ["O", 0, 1, {"a": 1}, [], [], None]}),
     "an object where a tuple was expected"),
    (_forged({"classes": {}, "root": ["D", 0, 0, 1, 0, 1, [1, 2]]}),
     "kept elements: [1, 2], expected a list of 3-tuples"),
    (_forged({"classes": {}, "root": ["B", 1]}), "a binary node's state of 1 fields, expected 9"),
])
def test_what_is_not_a_snapshot_is_refused(data: bytes, message: str) -> None:
    """A checkpoint is only data: other versions, pickles, classes or attributes outside the
    engine's own, and malformed records are refused with SnapshotError, nothing run."""
    with pytest.raises(SnapshotError) as caught:
        restore(data)
    assert message in str(caught.value), str(caught.value)


def test_numbers_orjson_would_misread_come_back_as_written() -> None:
    """Snapshots are read with orjson where it reads what json does: an integer past 64 bits
    (orjson makes it a float) or a NaN (orjson refuses it) in an event's data is read by json."""
    import math

    from eva.parser import parse

    engine = Engine(EngineConfig(allowed_lateness=5))  # the event waits in the buffer
    engine.add_document(parse('class A = type == "a"\nprofile S per data.k = A\n'))
    data = {"k": 1, "big": 10**30, "nan": float("nan"), "near": 2**63 - 1}
    engine.push(Event("e1", "s", "a", 1_000_000, 0, data))
    (_, _, event), = restore(snapshot(engine)).export_state()["clock"][0]
    assert type(event.data["big"]) is int and event.data["big"] == 10**30
    assert math.isnan(event.data["nan"]) and event.data["near"] == 2**63 - 1


def test_a_pickle_in_place_of_a_snapshot_runs_nothing(tmp_path: Path) -> None:
    """The old format was a pickle: whoever could write a checkpoint ran code in the workers."""
    import pickle

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, ...]:
            return (open, (str(marker), "w"))

    with pytest.raises(SnapshotError):
        restore(pickle.dumps(Payload()))
    assert not marker.exists()


def _nested(depth: int) -> bytes:
    """A snapshot whose root is a tuple nested ``depth`` deep (JSON text written directly:
    json.dumps would itself refuse it)."""
    import zlib

    text = '{"classes":{},"root":' + '["t",' * depth + "1" + "]" * depth + "}"
    return b"evamed-engine-snapshot 5\n" + zlib.compress(text.encode())


@pytest.mark.parametrize("depth", [150, 900, 100_000])
def test_nesting_deeper_than_the_stack_is_refused(depth: int) -> None:
    """150 levels are read (4 frames a level in the reader, within Python's 1,000); deeper
    ones run out of stack in the JSON decoder or in the reader: a SnapshotError either way."""
    if depth == 150:
        with pytest.raises(SnapshotError, match="holds a tuple, not an engine"):
            restore(_nested(depth))
        return
    with pytest.raises(SnapshotError, match="malformed engine snapshot: RecursionError"):
        restore(_nested(depth))


def _bomb(document: bytes, padding: int) -> bytes:
    """A snapshot whose JSON is ``document`` then ``padding`` spaces (valid JSON still), a few
    KB compressed: built in chunks, so the test itself never holds it inflated."""
    import zlib

    packer = zlib.compressobj(9)
    body = packer.compress(document)
    chunk = b" " * (1 << 20)
    for _ in range(padding >> 20):
        body += packer.compress(chunk)
    return b"evamed-engine-snapshot 5\n" + body + packer.flush()


def test_a_zlib_bomb_is_refused_without_being_inflated(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 KB that inflated to 200 MB were read whole (426 MB resident): now reading stops one
    byte past MAX_STATE_BYTES (lowered here to 1 MiB, so that the test stays small)."""
    import tracemalloc

    from eva import snapshot as module

    monkeypatch.setattr(module, "MAX_STATE_BYTES", 1 << 20)
    bomb = _bomb(b'{"classes":{},"root":null}', 64 << 20)  # 64 MiB of JSON, 64 KB compressed
    assert len(bomb) < 100_000
    tracemalloc.start()
    try:
        with pytest.raises(SnapshotError, match="inflates to more than 1,048,576 bytes"):
            restore(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_a_state_too_large_to_read_back_is_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer holds to the reader's bound: a snapshot that could not be restored would lose
    the state at the next restart, so it is refused when written, with the size found."""
    import zlib

    from eva import snapshot as module
    from eva.parser import parse

    engine = Engine(EngineConfig())
    engine.add_document(parse('class A = type == "a"\nprofile S per data.k = A\n'))
    engine.push(Event("e1", "s", "a", 1_000_000, 0, {"k": 1}))
    size = len(zlib.decompress(snapshot(engine).partition(b"\n")[2]))
    monkeypatch.setattr(module, "MAX_STATE_BYTES", size)
    assert type(restore(snapshot(engine))) is Engine  # at the bound: written and read
    monkeypatch.setattr(module, "MAX_STATE_BYTES", size - 1)
    with pytest.raises(SnapshotError, match=f"the engine state is {size:,} bytes of JSON, over "
                       f"the {size - 1:,} a snapshot may hold"):
        snapshot(engine)


def test_state_that_does_not_fit_the_recompiled_profile_is_refused() -> None:
    """Two profiles' state records swapped (a crafted or mixed-up checkpoint) are refused when
    restored, with the profile, partition and records named — not a TypeError at the next
    event (the Spark processor handles SnapshotError only)."""
    from eva.parser import parse

    engine = Engine(EngineConfig())
    engine.add_document(parse(
        'class A = type == "a"\nclass B = type == "b"\n'
        "profile N per data.k = ((not A)_2s)_all_pairs\n"
        "profile Q per data.k = ((all_dup(A); all_dup(B))_5s)_all_pairs\n"))
    engine.push(Event("a1", "s", "a", 1_000_000, 0, {"k": 1}))
    engine.push(Event("a2", "s", "a", 3_000_000, 1, {"k": 2}))
    negation, binary = (next(iter(p.partitions.values())) for p in engine._profiles.values())
    negation.state, binary.state = binary.state, negation.state
    with pytest.raises(SnapshotError, match=r"snapshot of profile 'N', partition 1: the state "
                       r"of a NegationNode is a BinaryState, expected a NegationState \(the "
                       "state does not fit the profile compiled from its document\\)"):
        restore(snapshot(engine))
    negation.state, binary.state = binary.state, negation.state
    budget = binary.state.budget
    binary.state.budget = type(budget)(budget.cap)  # counted against no profile's budget
    with pytest.raises(SnapshotError, match="partition 1: the state of a BinaryNode holds "
                       "another budget where its profile's budget was expected"):
        restore(snapshot(engine))


def test_a_restored_engine_evicts_in_the_same_order_as_the_original() -> None:
    """Partitions not kept keep their place in the eviction order across a snapshot: k1's
    partition, opened (not kept) before the snapshot, is still the oldest after it."""
    from eva.parser import parse

    doc = parse('class A = type == "a"\nclass B = type == "b"\n'
                "profile P per data.k = ((all_dup(A); all_dup(B))_inf)_all_pairs\n")
    trace = [Event(f"e{i}", "s", kind, (i + 1) * 1_000_000, i, {"k": key})
             for i, (kind, key) in enumerate([("b", "k1"), ("a", "k2"), ("a", "k1"),
                                              ("a", "k2"), ("b", "k1"), ("b", "k2")])]
    for cut in range(len(trace) + 1):
        letters: list[object] = []
        first = Engine(EngineConfig(state_cap=2), letters.append)
        first.add_document(doc)
        got = [n for e in trace[:cut] for n in first.push(e)]
        second = restore(snapshot(first), letters.append)
        got += [n for e in trace[cut:] for n in second.push(e)] + second.close()
        assert [(n.partition, n.occ.events) for n in got] == [("k2", ("e3", "e5"))], cut
        assert len(letters) == 1
