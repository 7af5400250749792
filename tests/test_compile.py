"""Compile once (issue 12): a profile is compiled at registration into immutable node specs;
a ``per`` partition costs a state record, never a compile; state records are data."""

from __future__ import annotations

import ast as pyast
import json
from pathlib import Path

import pytest

import eva
import eva.compiler as compile_module
from eva import ast, native
from eva import nodes as nd
from eva.engine import Engine, EngineConfig
from eva.events import TICK_SOURCE, TICK_TYPE, Event, tick_event
from eva.parser import parse
from eva.semantics import time_event
from eva.state import FIELDS

DOC = ('class A = type == "a"\nclass B = type == "b"\n'
       "profile P per data.k = ((all_dup(A); last_dup(B))_5s)_all_pairs\n"
       "profile Q per data.k evaluate end_of_interval = "
       "((all_dup(A), all_dup(((not B)_2s)_all_pairs))_3s)_unique_pairs\n")


def _events(n: int) -> list[Event]:
    return [Event(f"e{i}", "s", "ab"[i % 2], i * 1_000_000, i, {"k": i % 7}) for i in range(n)]


def _slots() -> dict[str, tuple[str, ...]]:
    """Each spec class's fields, read from the source: a class compiled by mypyc has no
    ``__slots__`` to ask."""
    tree = pyast.parse((Path(eva.__file__).parent / "nodes.py").read_text(encoding="utf-8"))
    out: dict[str, tuple[str, ...]] = {}
    for cls in tree.body:
        if isinstance(cls, pyast.ClassDef):
            for stmt in cls.body:
                if isinstance(stmt, pyast.Assign) and getattr(stmt.targets[0], "id", "") == "__slots__":
                    out[cls.name] = tuple(pyast.literal_eval(stmt.value))
    return out


SLOTS = _slots()


def _settings(node: nd.Node) -> list[tuple[str, object]]:
    """Every setting of a spec tree, depth first (children by their own settings)."""
    out: list[tuple[str, object]] = []
    names = SLOTS[type(node).__name__]
    for name in names:
        value = getattr(node, name)
        if isinstance(value, nd.Node):
            out += [(name, type(value).__name__), *_settings(value)]
        else:
            out.append((name, value))
    return out


def test_a_new_partition_costs_a_state_record_not_a_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[str] = []
    real = compile_module.compile_profile

    def counting(profile: ast.Profile, *args: object, **kwargs: object) -> compile_module.ProfileSpec:
        compiled.append(profile.name)
        return real(profile, *args, **kwargs)  # type: ignore[arg-type]

    # Compiled by mypyc, the engine calls compile_profile directly: only the pure engine can be
    # counted, the spec's identity is checked either way.
    counted = "engine" not in native.running()
    monkeypatch.setattr("eva.engine.compile_profile", counting)
    engine = Engine()
    engine.add_document(parse(DOC))
    specs = [p.spec for p in engine._profiles.values()]
    for event in _events(50):
        engine.push(event)
    engine.close()
    assert [p.spec for p in engine._profiles.values()] == specs
    assert all(a is b for a, b in zip(specs, [p.spec for p in engine._profiles.values()], strict=True))
    assert [len(p.partitions) for p in engine._profiles.values()] == [7, 7]
    if counted:
        assert compiled == ["P", "Q"]  # once each, at registration, for 7 partitions each


def test_specs_are_not_changed_by_evaluation() -> None:
    engine = Engine()
    engine.add_document(parse(DOC))
    roots = [p.spec.root for p in engine._profiles.values()]
    before = [_settings(r) for r in roots]
    for event in _events(200):
        engine.push(event)
    engine.close()
    assert [_settings(r) for r in roots] == before


def test_state_records_hold_data_only() -> None:
    """No record field holds a spec, a function or a class: what a snapshot writes."""
    engine = Engine()
    engine.add_document(parse(DOC))
    for event in _events(40):
        engine.push(event)
    seen = 0
    stack = [q.state for p in engine._profiles.values() for q in p.partitions.values()]
    while stack:
        record = stack.pop()
        if record is None:
            continue
        assert type(record) in FIELDS, type(record)
        for name in FIELDS[type(record)]:
            value = getattr(record, name)
            assert (not isinstance(value, nd.Node) and not callable(value)) or type(value) in FIELDS
            if type(value) in FIELDS and name in ("child", "left", "right"):
                stack.append(value)
        seen += 1
    assert seen >= 14


def test_engine_config_round_trips_through_json() -> None:
    config = EngineConfig(tick=5, allowed_lateness=3, gc=False, sources=("a", "b"), horizon=None,
                          remember=None)
    text = json.dumps(config.to_json())
    assert EngineConfig.from_json(json.loads(text)) == config


@pytest.mark.parametrize(("data", "message"), [
    ([1], "expected a JSON object, found list"),
    ({"tick": 1}, "fields ['tick'], expected"),
    ({**EngineConfig().to_json(), "tick": "1"}, "tick is '1', expected an integer"),
    ({**EngineConfig().to_json(), "horizon": 1.5}, "horizon is 1.5, expected an integer or null"),
    ({**EngineConfig().to_json(), "gc": 1}, "gc is 1, expected true or false"),
    ({**EngineConfig().to_json(), "sources": "a"}, "sources is 'a', expected a list of strings"),
])
def test_an_engine_config_that_is_not_one_is_refused_by_name(data: object, message: str) -> None:
    with pytest.raises(ValueError, match="engine configuration: ") as caught:
        EngineConfig.from_json(data)
    assert message in str(caught.value)


def test_the_tick_identity_is_spelled_once() -> None:
    tick = tick_event("HalfHour", 1_800_000_000, "1970-01-01T00:30:00Z")
    assert (tick.type, tick.source) == (TICK_TYPE + "HalfHour", TICK_SOURCE)
    assert time_event("HalfHour", 0, 1_800_000_000, "1970-01-01T00:30:00Z").events == (tick.id,)


def test_dup_kind_is_an_enum_that_compares_as_text() -> None:
    assert ast.Dup("last").kind is ast.DupKind.LAST  # type: ignore[arg-type]  # text, converted
    assert ast.nth(2).kind == "nth" and str(ast.nth(2)) == "2_dup"
    with pytest.raises(ValueError):
        ast.Dup("fist")  # type: ignore[arg-type]


def test_the_package_exports_a_small_api_lazily() -> None:
    assert eva.parse is parse and eva.Engine is Engine
    assert eva.compile is compile_module.compile_profile
    assert callable(eva.reference.evaluate) and eva.evaluate is eva.reference.evaluate


def test_a_new_partition_that_keeps_nothing_is_not_kept() -> None:
    """A posterior event opening a ``per`` partition leaves it at rest: it costs no entry (the
    next event of its key opens the same one), and the answers are the reference's."""
    from eva.reference import evaluate

    doc = parse('class A = type == "A"\nclass B = type == "B"\n'
                "profile P per data.k = ((all_dup(A); all_dup(B))_5s)_all_pairs\n")
    engine = Engine(EngineConfig())
    engine.add_document(doc)
    trace = [Event("b1", "s", "B", 1_000_000, 0, {"k": "x"}),
             Event("b2", "s", "B", 2_000_000, 1, {"k": 7})]
    for event in trace:
        assert engine.push(event) == []
    assert engine.export_state()["profiles"][0][6] == []  # no partition held
    trace += [Event("a1", "s", "A", 3_000_000, 2, {"k": "x"}),
              Event("b3", "s", "B", 4_000_000, 3, {"k": "x"})]
    got = [n for e in trace[2:] for n in engine.push(e)] + engine.close()
    assert [(n.partition, n.occ.events) for n in got] == [("x", ("a1", "b3"))]
    assert got == evaluate(doc, trace)
