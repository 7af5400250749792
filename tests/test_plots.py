"""Pictures (``--plot``): the image is written and not empty, the arcs drawn are the
composites, the plan tree has a box per plan node, and docs/semantics.md's Fig. 3 table is what
the engine answers."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from eva.engine import replay
from eva.events import Event, format_time
from eva.parser import parse
from mediator.cli import app
from mediator.plots import fig3, fig3_figure, fig3_table, plan_tree, timeline
from tests.test_paper_examples import FIG3_EXPECTED
from transforms.capability import PRESETS
from transforms.planner import plan
from transforms.plans import nodes

PAPER = Path("examples/logistics/profiles.eva")
PNG = b"\x89PNG\r\n\x1a\n"


def written(path: Path) -> bool:
    return path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG


def test_the_timeline_draws_an_arc_per_composite(tmp_path: Path) -> None:
    doc = parse('class A = type == "a"\nclass B = type == "b"\nclass T = every 2s\n'
                "profile S = ((all_dup(A); all_dup(B))_5s)_all_pairs\n"
                "profile N = ((all_dup(A); all_dup(((not B)_2s)_all_pairs))_2s)_all_pairs\n"
                "profile K = ((all_dup(T); all_dup(B))_1s)_all_pairs\n")
    events = [Event(f"{k}{i}", "urn:t", k, i * 1_000_000, i)
              for i, k in enumerate("aabab" * 3 + "aaa", start=1)]
    notes = replay(doc, events)
    arcs = timeline(events, notes, tmp_path / "t.png")
    assert written(tmp_path / "t.png")
    assert [(a.profile, a.events) for a in arcs] == [(n.profile, n.occ.events) for n in notes]
    rows = {"a": 0, "b": 1, "clock": 2}  # types in order of first appearance, then the clock
    for arc, n in zip(arcs, notes, strict=True):  # each constituent's own time and row
        assert len(arc.points) == len(n.occ.events)
        for (time, row), ident in zip(arc.points, n.occ.events, strict=True):
            if ident[0] in "ab" and ident[1:].isdigit():
                assert (time, row) == (int(ident[1:]) * 1_000_000, rows[ident[0]])
            else:  # a tick or an absence, at the time its id names
                assert row == rows["clock"] and ident.endswith(format_time(time))
    assert {a.profile for a in arcs} == {"S", "N", "K"}  # ticks and absences drawn too


def test_the_plan_tree_has_a_box_per_node(tmp_path: Path) -> None:
    doc = parse(PAPER.read_text())
    p3 = plan(doc.profiles[2], doc, PRESETS["cg1"])
    boxes = plan_tree(p3, tmp_path / "p3.png")
    assert written(tmp_path / "p3.png")
    assert len(boxes) == len(list(nodes(p3.root)))
    assert boxes[0].startswith("D mediator: sequence") and "At2pm" in boxes[1]


def test_explain_plot_writes_a_tree_per_plan(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["explain", "--profiles", str(PAPER), "--profile", "P6",
                                      "--group", "cg1", "--group", "cg3", "--plot",
                                      str(tmp_path / "p6.png")])
    assert result.exit_code == 0, result.output
    assert written(tmp_path / "p6-P6-cg1.png") and written(tmp_path / "p6-P6-cg3.png")


def test_fig3_by_the_engine_is_the_paper_and_the_docs() -> None:
    assert fig3() == FIG3_EXPECTED
    docs = (Path(__file__).parent.parent / "docs" / "semantics.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- fig3:begin -->\n(.*?)<!-- fig3:end -->", docs, re.S)
    assert found is not None and found.group(1) == fig3_table()


def test_fig3_is_drawn(tmp_path: Path) -> None:
    fig3_figure(tmp_path / "fig3.png")
    assert written(tmp_path / "fig3.png")


def test_replay_plot_draws_the_composites_it_prints(tmp_path: Path) -> None:
    from examples.logistics.generate import day

    events = tmp_path / "day.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in day(7)))
    result = CliRunner().invoke(app, ["replay", "--profiles", str(PAPER), "--events",
                                      str(events), "--plot", str(tmp_path / "day.png")])
    assert result.exit_code == 0, result.output
    assert written(tmp_path / "day.png")
    assert "304 events and 57 composites drawn" in result.stderr


def test_a_file_kind_matplotlib_cannot_write_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["explain", "--profiles", str(PAPER), "--profile", "P1",
                                      "--group", "cg3", "--plot", str(tmp_path / "p.xyz")])
    assert result.exit_code == 2
    assert "found .xyz, expected .png, .svg, .pdf" in result.output
    assert "Traceback" not in result.output
