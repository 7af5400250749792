"""The mediator's shared languages keep their recent parses (adapters.backends.registry)."""

from __future__ import annotations

import pytest

from adapters.backends.native import NativeQueryError
from adapters.backends.registry import Recalled, language, shared_language

SQL = "SELECT x.id FROM events AS x WHERE x.type = 'A'"


def test_a_text_is_parsed_once_and_refusals_are_not_kept() -> None:
    inner = language("cg3")
    calls: list[str] = []

    class Counting:
        name, group, capability = inner.name, inner.group, inner.capability

        def parse(self, text: str) -> object:
            calls.append(text)
            return inner.parse(text)

    recalled = Recalled(Counting(), size=2)  # type: ignore[arg-type]
    first = recalled.parse(SQL)
    assert recalled.parse(SQL) is first and calls == [SQL]
    for _ in range(2):
        with pytest.raises(NativeQueryError):
            recalled.parse("SELECT FROM")
    assert calls == [SQL, "SELECT FROM", "SELECT FROM"]
    # bounded: the least recently used goes first
    recalled.parse(SQL + " AND x.time > 1")
    recalled.parse(SQL)
    recalled.parse(SQL + " AND x.time > 2")
    assert len(calls) == 5
    recalled.parse(SQL)
    assert len(calls) == 5
    recalled.parse(SQL + " AND x.time > 1")
    assert len(calls) == 6


def test_one_shared_language_per_group_and_clock() -> None:
    assert shared_language("cg3") is shared_language("cg3", 1_000_000)  # the planner's, the link's
    assert shared_language("cg3") is shared_language("cg3", 250_000)  # a clock it has not
    assert shared_language("cg5", 1000) is not shared_language("cg5")
    assert shared_language("cg2").group == "cg2"
