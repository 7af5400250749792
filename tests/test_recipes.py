"""The recipes of docs/language.md run as written: each profile block, through the reference
evaluator and the engine, reports what the text says on the shop trace described there; each
"usual mistake" gets the message the table shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eva.engine import replay
from eva.events import Event, from_cloudevent
from eva.parser import ProfileError, parse
from eva.reference import evaluate

DOC = (Path(__file__).parent.parent / "docs" / "language.md").read_text(encoding="utf-8")
BLOCKS = dict(re.findall(r"<!-- recipe: (\w+) -->\n```\n(.*?)```", DOC, re.S))
DAY = 86_400_000_000

EXPECTED = {
    "PaidInTime": [("o1", ("o1", "p1"))],
    "Unpaid": [("o2", ("o2", "absence@2026-03-02T09:11:00Z"))],
    "NoReport": [(None, ("tick:Daily@2026-03-03T10:00:00Z", "absence@2026-03-03T11:00:00Z"))],
    "ThirdFailure": [("u", ("l3",))],
}


def shop() -> list[Event]:
    def event(seq: int, ident: str, kind: str, clock: str, **data: str) -> Event:
        return from_cloudevent({"specversion": "1.0", "id": ident, "source": "urn:shop",
                                "type": kind, "time": f"2026-03-02T{clock}Z", "data": data}, seq)

    rows = [("o1", "order.placed", "09:00:00", {"order": "o1"}),
            ("o2", "order.placed", "09:01:00", {"order": "o2"}),
            ("p1", "payment.received", "09:05:00", {"order": "o1"}),
            ("p1b", "payment.received", "09:07:00", {"order": "o1"}),
            ("p2", "payment.received", "09:30:00", {"order": "o2"}),
            ("r1", "report.filed", "10:20:00", {})]
    rows += [(f"l{n}", "login.failed", f"10:30:0{n - 1}", {"user": "u"}) for n in range(1, 8)]
    return [event(seq, ident, kind, clock, **data)
            for seq, (ident, kind, clock, data) in enumerate(rows)]


def test_every_recipe_of_the_doc_is_tested() -> None:
    assert set(BLOCKS) == {"classes", *EXPECTED}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_recipe_reports_what_the_doc_says(name: str) -> None:
    doc = parse(BLOCKS["classes"] + BLOCKS[name])
    events = shop()
    end = events[-1].time + 2 * DAY  # the next day's 10:00 and 11:00 too
    want = EXPECTED[name]
    for answer in (evaluate(doc, events, end=end), replay(doc, events, until=end)):
        assert [(n.partition, n.occ.events) for n in answer] == want


@pytest.mark.parametrize(("pairs", "want"), [("unique_pairs", ["l3"]),
                                             ("repeated_pairs", ["l3", "l6"]),
                                             ("all_pairs", ["l3", "l4", "l5", "l6", "l7"])])
def test_the_third_failure_under_each_consumption(pairs: str, want: list[str]) -> None:
    """What the ThirdFailure recipe says of the three consumptions."""
    text = BLOCKS["ThirdFailure"].replace("_unique_pairs", f"_{pairs}")
    doc = parse(BLOCKS["classes"] + text)
    events = shop()
    for answer in (evaluate(doc, events), replay(doc, events)):
        assert [n.occ.events[0] for n in answer] == want


def mistakes() -> list[tuple[str, str]]:
    table = DOC.split("The usual mistakes")[1].split("## Errors")[0]
    rows = re.findall(r"^\| `(.+?)` \| (.+?) \|$", table, re.M)
    assert len(rows) == 5
    return rows


@pytest.mark.parametrize(("written", "message"), mistakes())
def test_a_usual_mistake_gets_the_message_the_doc_shows(written: str, message: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse(f'class A = type == "a"\nclass B = type == "b"\nprofile X = {written}\n')
    assert message in str(caught.value)
