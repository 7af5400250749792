"""The CG-3 (SQL) dialect: EVA → SQL text (sqlglot trees printed by sqlglot), identity under
sqlglot (validate_identity) and the language's own reading of what is rendered."""

from __future__ import annotations

import pytest
import sqlglot

from adapters.backends.sql import SqlLanguage
from eva.parser import parse
from transforms.dialects import dialect
from transforms.dialects.base import Unsupported

CLASSES = ('class A = type == "a"\n'
           'class B = type == "b" and data.n > 2\n'
           'class C = type == "c" and (data.n == 1 or data.x.y == "it\'s") and ext <= -1.5\n'
           'class W = type == "w" and data != 1 and not data.n == 1 and source == null\n'
           'class Z = data.n in [1, "u", true]\n'
           'class T = every 30min\n')

SQL = dialect("cg3")


@pytest.mark.parametrize(("eva", "sql"), [
    ("A", 'SELECT a1.id FROM "a" AS a1'),
    ("B", "SELECT a1.id FROM events AS a1 WHERE a1.type = 'b' AND JSON_VALUE(a1.data, '$.n') > 2"),
    ("C", "SELECT a1.id FROM events AS a1 WHERE a1.type = 'c' AND (JSON_VALUE(a1.data, '$.n') = 1 "
          "OR JSON_VALUE(a1.data, '$.x.y') = 'it''s') AND a1.\"ext\" <= -1.5"),
    ("W", "SELECT a1.id FROM events AS a1 WHERE a1.type = 'w'"),
    ("Z", "SELECT a1.id FROM events AS a1 WHERE JSON_VALUE(a1.data, '$.n') IN (1, 'u', TRUE)"),
    ("((all_dup(A); all_dup(T))_30min)_all_pairs",
     'SELECT a1.id, a2.id FROM "a" AS a1 JOIN "eva.tick.T" AS a2 ON a2.time > a1.time AND '
     "a2.time <= a1.time + INTERVAL '30' MINUTE"),
    ("((all_dup(A), all_dup(((all_dup(A); all_dup(A))_inf)_all_pairs))_90s)_all_pairs",
     'SELECT a1.id, a2.id, a3.id FROM "a" AS a1 JOIN "a" AS a2 ON TRUE JOIN "a" AS a3 ON '
     "a3.time > a2.time AND a3.time >= a1.time - INTERVAL '90' SECOND AND a3.time <= a1.time + "
     "INTERVAL '90' SECOND"),
    ("((all_dup((all_dup(A) | all_dup(((all_dup(A), all_dup(A))_inf)_all_pairs))_all_pairs); "
     "all_dup(A))_1ms)_all_pairs",
     'SELECT a1.id, a2.id, NULL FROM "a" AS a1 JOIN "a" AS a2 ON a2.time > a1.time AND a2.time <= '
     "a1.time + INTERVAL '1' MILLISECOND UNION ALL SELECT a1.id, a2.id, a3.id FROM \"a\" AS a1 "
     'JOIN "a" AS a2 ON TRUE JOIN "a" AS a3 ON a3.time > GREATEST(a1.time, a2.time) AND a3.time '
     "<= GREATEST(a1.time, a2.time) + INTERVAL '1' MILLISECOND"),
])
def test_eva_to_sql(eva: str, sql: str) -> None:
    doc = parse(CLASSES + f"profile P = {eva}\n")
    text = SQL.render(doc.profiles[0].expr, doc)
    assert text == sql
    assert sqlglot.parse_one(text).sql() == text  # validate_identity
    SqlLanguage().parse(text)  # and the service reads it


def test_what_sql_cannot_state() -> None:
    doc = parse(CLASSES + "profile P = ((not A)_5s)_all_pairs\n")
    assert SQL.generate(doc.profiles[0].expr, doc, level=Unsupported.IGNORE).unsupported == (
        "SQL interval joins cannot state negation",)
    expr = parse(CLASSES + "class D = data == 1\nprofile P = D\n")
    assert not SQL.can_render(expr.profiles[0].expr, expr)
