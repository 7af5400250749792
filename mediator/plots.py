"""Pictures for people (``--plot``), in the manner of the EVA paper's figures: a trace as a
timeline with a row per event type and each composite as arcs over its constituents (Figs. 3,
8, 9), and a plan as a tree of boxes (services, rules, kinds).

matplotlib is imported inside the functions, with its file-only backend: the CLI starts
without it, and no display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from eva.events import Event, clock_id
from eva.semantics import Notification
from transforms.plans import Local, Plan, PlanNode, Remote, Subscribe

CLOCK_ROW = "time events"
"""The row of the constituents that are not primitive events: ticks and passive events."""


@dataclass(frozen=True)
class Arc:
    """One composite as drawn: its profile, constituents, and the points joined — (time in
    µs, row) of each constituent found in the trace or named by a tick or absence id."""

    profile: str
    events: tuple[str, ...]
    points: tuple[tuple[int, int], ...]


FORMATS = (".png", ".svg", ".pdf")


class PlotError(ValueError):
    """A picture that cannot be drawn where asked (the file's kind, or writing it)."""


def check_path(path: Path) -> None:
    """Refuse a file name whose kind matplotlib would not write, before any work is done."""
    if path.suffix.lower() not in FORMATS:
        raise PlotError(f"cannot draw {path}: found {path.suffix or 'no suffix'}, expected "
                        f"{', '.join(FORMATS)}")


def _figure(width: float, height: float, rows: int = 1, columns: int = 1,
            **options: Any) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, columns, figsize=(width, height), **options)


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    try:
        check_path(path)
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise PlotError(f"cannot draw {path}: {exc}") from None
    finally:
        plt.close(fig)


def _when(micros: int) -> datetime:
    return datetime.fromtimestamp(micros / 1e6, UTC)


def timeline(events: Sequence[Event], notes: Sequence[Notification], path: Path,
             title: str = "") -> list[Arc]:
    """The trace, a row per event type (in order of first appearance), and each composite as
    arcs joining its constituents in order, a colour per profile. Returns the arcs drawn."""
    import matplotlib.dates as mdates

    rows: dict[str, int] = {}
    where: dict[str, tuple[int, int]] = {}
    for event in events:
        row = rows.setdefault(event.type, len(rows))
        where[event.id] = (event.time, row)
    if any(i not in where for n in notes for i in n.occ.events):
        rows[CLOCK_ROW] = len(rows)
    fig, ax = _figure(12, 1.2 + 0.5 * len(rows))
    ax.scatter([_when(t) for t, _ in where.values()], [r for _, r in where.values()],
               s=12, color="black", zorder=3)
    profiles = list(dict.fromkeys(n.profile for n in notes))
    colours = {p: f"C{i % 10}" for i, p in enumerate(profiles)}
    arcs = []
    for n in notes:
        points = []
        for ident in n.occ.events:
            found = where.get(ident)
            if found is None and (clock := clock_id(ident)) is not None:
                at = clock[1]
                found = (at, rows[CLOCK_ROW])
                ax.scatter([_when(at)], [found[1]], s=12, marker="s", color="grey", zorder=3)
            if found is not None:
                points.append(found)
        for (t1, r1), (t2, r2) in pairwise(points):
            _arc(ax, _when(t1), r1, _when(t2), r2, colours[n.profile])
        if len(points) == 1:  # a composite of one event (a filter, a selection): a ring on it
            ax.scatter([_when(points[0][0])], [points[0][1]], s=90, facecolors="none",
                       edgecolors=colours[n.profile], linewidths=1.5, zorder=4)
        arcs.append(Arc(n.profile, n.occ.events, tuple(points)))
    for p in profiles:
        ax.plot([], [], color=colours[p], label=p)
    ax.set_yticks(range(len(rows)), list(rows))
    ax.set_ylim(-0.7, len(rows) - 0.2)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))  # type: ignore[no-untyped-call]
    ax.set_xlabel("time (UTC)")
    ax.set_title(title or f"{len(events)} event{'' if len(events) == 1 else 's'}, "
                 f"{len(notes)} composite{'' if len(notes) == 1 else 's'}")
    if profiles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path)
    return arcs


def _arc(ax: Any, x1: datetime, y1: int, x2: datetime, y2: int, colour: str) -> None:
    """A curve from one constituent to the next, bowed upwards (the paper's arcs)."""
    import matplotlib.dates as mdates
    from matplotlib.patches import FancyArrowPatch

    start = (mdates.date2num(x1), y1)  # type: ignore[no-untyped-call]
    end = (mdates.date2num(x2), y2)  # type: ignore[no-untyped-call]
    ax.add_patch(FancyArrowPatch(start, end, connectionstyle="arc3,rad=-0.3", arrowstyle="-",
                                 color=colour, alpha=0.7, linewidth=1.2))


# ---------------------------------------------------------------- plans


def _box(node: PlanNode) -> tuple[str, str]:
    """A plan node's text and colour."""
    if isinstance(node, Subscribe):
        where = "mediator clock" if node.clock else (f"{node.service}" if node.service
                                                     else "filter")
        return f"↔ {node.name}\n{where}", "#dbeafe"
    if isinstance(node, Remote):
        from eva.printer import expr_text

        text = expr_text(node.target)
        short = text if len(text) <= 48 else text[:45] + "…"
        at = f"service {node.service}" if node.service else "service"
        return (f"{node.kind.symbol} {at}\n{short}\n({', '.join(dict.fromkeys(node.rules))})",
                "#dcfce7" if node.kind.symbol == "↔" else "#fef9c3")
    from transforms.explanation import shape

    return (f"D mediator: {type(node.node).__name__.lower()}\n{shape(node.node)}\n({node.rule})",
            "#fee2e2")


def plan_tree(plan: Plan, path: Path) -> list[str]:
    """The plan as a tree of boxes (kind, service, rule), root on top. Returns the boxes'
    texts, depth first."""
    places: list[tuple[PlanNode, float, int]] = []
    edges: list[tuple[int, int]] = []
    next_x = [0.0]

    def place(node: PlanNode, depth: int) -> int:
        index = len(places)
        places.append((node, 0.0, depth))
        kids = [place(child, depth + 1) for child in node.children] if isinstance(node, Local) \
            else []
        if kids:
            x = sum(places[k][1] for k in kids) / len(kids)
        else:
            x, next_x[0] = next_x[0], next_x[0] + 1.0
        places[index] = (node, x, depth)
        edges.extend((index, k) for k in kids)
        return index

    place(plan.root, 0)
    depth = max(d for _, _, d in places) + 1
    fig, ax = _figure(max(4.0, 3.2 * next_x[0]), 1.0 + 1.5 * depth)
    for parent, child in edges:
        ax.plot([places[parent][1], places[child][1]], [-places[parent][2], -places[child][2]],
                color="grey", zorder=1)
    texts = []
    for node, x, d in places:
        text, colour = _box(node)
        texts.append(text)
        ax.text(x, -d, text, ha="center", va="center", fontsize=8, zorder=2,
                bbox={"boxstyle": "round", "facecolor": colour, "edgecolor": "grey"})
    where = ", ".join(n for n, _ in plan.services) or plan.capability.name
    ax.set_title(f"{plan.profile.name} over {where} — {plan.kind.symbol} {plan.kind}")
    ax.set_xlim(-0.8, next_x[0] - 0.2)
    ax.set_ylim(-depth + 0.4, 0.6)
    ax.axis("off")
    _save(fig, path)
    return texts


# ---------------------------------------------------------------- the paper's Fig. 3

FIG3_TRACE = (("a1", "A", 1), ("a2", "A", 2), ("b1", "B", 3), ("b2", "B", 4), ("a3", "A", 5),
              ("b3", "B", 6))
"""o o x x o x: the sequence (E1;E2) of the paper's Fig. 3, no time frame."""
FIG3_ROWS = (("A", "all_pairs"), ("B", "unique_pairs"), ("C", "repeated_pairs"))
FIG3_COLUMNS = (("I", "first"), ("II", "last"), ("III", "all"))


def fig3() -> dict[tuple[str, str], list[tuple[str, ...]]]:
    """Fig. 3's nine situations as the engine answers them: (dup, pairs) → the pairs."""
    from eva.engine import replay
    from eva.parser import parse

    events = [Event(ident, "urn:fig3", kind, second * 1_000_000, seq)
              for seq, (ident, kind, second) in enumerate(FIG3_TRACE)]
    out = {}
    for _, pairs in FIG3_ROWS:
        for _, dup in FIG3_COLUMNS:
            doc = parse('class A = type == "A"\nclass B = type == "B"\n'
                        f"profile S = (({dup}_dup(A); {dup}_dup(B))_inf)_{pairs}\n")
            out[(dup, pairs)] = [n.occ.events for n in replay(doc, events)]
    return out


def fig3_table() -> str:
    """Fig. 3 as a Markdown table, regenerated by the engine (docs/semantics.md holds it;
    a test keeps the two equal)."""
    answers = fig3()
    head = "| | " + " | ".join(f"{c} `{d}_dup`" for c, d in FIG3_COLUMNS) + " |"
    lines = [head, "|---|---|---|---|"]
    for row, pairs in FIG3_ROWS:
        cells = [" ".join(f"({', '.join(p)})" for p in answers[(dup, pairs)])
                 for _, dup in FIG3_COLUMNS]
        lines.append(f"| {row} `{pairs}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def fig3_figure(path: Path) -> None:
    """Fig. 3 drawn: the trace o o x x o x in each of the nine cells, arcs for the pairs."""
    answers = fig3()
    fig, axes = _figure(10, 5.5, 3, 3, sharex=True, sharey=True)
    x = {ident: second for ident, _, second in FIG3_TRACE}
    for i, (row, pairs) in enumerate(FIG3_ROWS):
        for j, (column, dup) in enumerate(FIG3_COLUMNS):
            ax = axes[i][j]
            for ident, kind, second in FIG3_TRACE:
                ax.text(second, 0, "o" if kind == "A" else "x", ha="center", va="center",
                        fontsize=12)
                ax.text(second, -0.35, ident, ha="center", fontsize=7, color="grey")
            for k, (a, b) in enumerate(answers[(dup, pairs)]):
                from matplotlib.patches import FancyArrowPatch

                ax.add_patch(FancyArrowPatch((x[a], 0.15), (x[b], 0.15), arrowstyle="-",
                                             connectionstyle=f"arc3,rad=-{0.4 + 0.1 * (k % 3)}",
                                             color=f"C{k % 10}", linewidth=1.2))
            ax.set_xlim(0.3, 6.7)
            ax.set_ylim(-0.6, 1.6)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"{column}: {dup}_dup", fontsize=9)
            if j == 0:
                ax.set_ylabel(f"{row}: {pairs}", fontsize=9)
    fig.suptitle("EVA Fig. 3 — ((D(A); D(B))_inf)_Pairs over o o x x o x, by the engine")
    _save(fig, path)
