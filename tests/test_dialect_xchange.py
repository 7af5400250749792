"""The CG-4 (XChange) dialect: EVA → XChange text and the native round trip."""

from __future__ import annotations

import pytest

from adapters.backends.xchange import Composite, Scalar, Term, Within, XChangeLanguage
from eva.parser import parse
from transforms.dialects import dialect
from transforms.dialects.base import Unsupported

CLASSES = ('class A = type == "a"\n'
           'class J = type == "traffic.jam" and data.area == "A" and data.n > 2\n'
           'class K = type in ["k", "and"] and data.x.y == 1 and data.x.z == true\n'
           'class N = data.n == 1 or data.n == 2\n'
           'class T = every 1h\n')

XCHANGE = dialect("cg4")


def term(label: str, *children: Term | Scalar, partial: bool = True) -> Term:
    return Term(label, children, partial)


@pytest.mark.parametrize(("eva", "text", "query"), [
    ("A", "a", term("a")),
    ("J", 'traffic.jam{{area{"A"}}}', term("traffic.jam", term("area", Scalar("A"),
                                                                 partial=False))),
    ("K", 'or{"and"{{x{{y{1}, z{true}}}}}, k{{x{{y{1}, z{true}}}}}}', None),
    ("N", "*", term("*")),
    ("T", "eva.tick.T", term("eva.tick.T")),
    ("((all_dup(A); all_dup(T))_2h)_all_pairs", "andthen[a, eva.tick.T] within 2h",
     Within(Composite("andthen", (term("a"), term("eva.tick.T"))), 7_200_000_000)),
    ("((all_dup(A), all_dup(((all_dup(A), all_dup(A))_3h)_all_pairs))_2h)_all_pairs",
     "and{a, a, a} within 2h",
     Within(Composite("and", (term("a"), term("a"), term("a"))), 7_200_000_000)),
    ("(all_dup(A) | all_dup(N))_all_pairs", "or{a, *}", Composite("or", (term("a"), term("*")))),
])
def test_eva_to_xchange_and_back(eva: str, text: str, query: object) -> None:
    doc = parse(CLASSES + f"profile P = {eva}\n")
    assert XCHANGE.render(doc.profiles[0].expr, doc) == text
    parsed = XChangeLanguage().parse(text).query
    if query is not None:
        assert parsed == query


@pytest.mark.parametrize(("eva", "message"), [
    ("((all_dup(A), all_dup(A))_inf)_all_pairs",
     "XChange needs a temporal restriction on every composite query"),
    ("((not A)_5s)_all_pairs", "XChange cannot state EVA's negation"),
])
def test_what_xchange_cannot_state(eva: str, message: str) -> None:
    doc = parse(CLASSES + f"profile P = {eva}\n")
    got = XCHANGE.generate(doc.profiles[0].expr, doc, level=Unsupported.IGNORE)
    assert got.unsupported == (message,) and got.text == ""
