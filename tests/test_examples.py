"""The native queries shipped in examples/queries run as the README shows: each in its
group's own language, over the logistics day, with notifications."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from examples.logistics.generate import day
from mediator.cli import app

QUERIES = sorted((Path(__file__).parent.parent / "examples" / "queries").iterdir())
GROUP = {".bool": "cg1", ".snoop": "cg2", ".sql": "cg3", ".xchange": "cg4"}


def test_every_language_has_an_example() -> None:
    assert {q.suffix for q in QUERIES} == set(GROUP)


@pytest.mark.parametrize("query", QUERIES, ids=[q.name for q in QUERIES])
def test_a_shipped_query_runs_over_the_day(query: Path, tmp_path: Path) -> None:
    import json

    events = tmp_path / "day.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in day(7)))
    result = CliRunner().invoke(app, ["replay", "--native", GROUP[query.suffix], "--query",
                                      str(query), "--events", str(events)])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") >= 3
