"""Every native parser, fuzzed (issue 11): any text is either accepted or refused with a
:class:`NativeQueryError` — never another exception — and an accepted query evaluates a short
trace without one either (a late event may be refused, as the service expects).

The inputs are the valid example queries each group's dialect renders for the paper's
logistics profiles and random-class profiles, plus hand-written ones for what ``render`` never
writes, then: random mutations of those (deletions, insertions of the language's own tokens,
duplications), random characters, and deep nesting of the language's brackets and operators.
Bounded: a few hundred cases per language, well under a minute in all."""

from __future__ import annotations

from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.backends.native import EventRejected, Exhausted, Language, NativeQueryError
from adapters.backends.registry import language
from eva import ast
from eva.events import Event
from eva.parser import parse
from tests.strategies import CLASSES
from transforms.dialects import dialect

CASES = 1000
"""Examples per language (each is one parse, and one short evaluation if accepted)."""

HAND_WRITTEN = {
    "cg1": ['AND([type = "a"], OR([data.k >= 1.5], NOT([type in ["a", "b"] & !(data.k = null)])))',
            '[source != "s" | subject = "x" & (data.x.y < -3 | data.z = true)]'],
    "cg2": ['a OR ezT ; (a OR c) AND (T OR  b) ANDa OR ezT  ; (a AND (T OR  b) AND (T OR  b) '
            'ANDa OR ezT  ; (a OR cAdezT ; (a OR c) ANDc) AND (b) ANDc OR e) AND (T ORa AND ('
            'T OR  b) AND (T OR  b) ANDa OR ezT  ; (a OR cAdezT ; (a OR c) ANDc) AND (b) ANDc'
            ' OR e) AND (T ORb) ANDc OR ezT  ; (a OR  b) AND Ad'],
    "cg3": ["SELECT x.id, y.id FROM events AS x JOIN \"b\" AS y ON y.time BETWEEN x.time AND "
            "x.time + INTERVAL '5' MICROSECOND WHERE JSON_VALUE(x.data, '$.k') IN (1, 2) AND "
            "NOT x.subject IS NULL UNION ALL SELECT z.id, NULL FROM c AS z WHERE "
            "ABS(z.time - 3) <= 2 OR z.type <> 'c'",
            "SELECT a.id FROM events AS a WHERE a.time - 1 BETWEEN SYMMETRIC 5. AND 01 "
            "AND (FALSE < TRUE) IS TRUE"],
    "cg4": ['without c during and{a{{k{var X}}}, b{k{var X}}} within 5us',
            'andthen[a{{"s", 1.5, true, x{{y{false}}}}}, or{*, "b c"}] within 2 min'],
    "cg5": [CLASSES + "profile P = ((all_dup(A); all_dup(B))_5us)_all_pairs\n"],
}

TOKENS = {
    "cg1": ["AND(", "OR(", "NOT(", "[", "]", ",", "(", ")", "&", "|", "!", "=", "!=", "<=",
            " in ", "type", "data.k", '"a"', "1", "1e999", "01", "true", "null", '"\\q"'],
    "cg2": [";", " AND ", " OR ", "NOT(", ")[", "]", ",", "(", ")", " CONTEXT ", "recent",
            "a", '"q"', "-"],
    "cg3": ["SELECT ", " FROM ", " JOIN ", " ON ", " WHERE ", " UNION ALL ", " AND ", " OR ",
            "NOT ", "(", ")", ",", "'", '"', "--", "/*", " BETWEEN ", " IN ", " IS NULL",
            "INTERVAL '5' MINUTE", "JSON_VALUE(", "ABS(", "GREATEST(", "FOO()", "x.time",
            "x.TIME", "5.", "01", "1e999", " AS A ", "$.k", "*", ";", "=", "<="],
    "cg4": ["and{", "andthen[", "or{", "}", "]", "{{", "}}", ",", " within ", "5us",
            " without ", " during ", "var X", '"s"', "1.5", "*", "true"],
    "cg5": ["profile P = ", "class A = ", "(", ")", "_5us", "_all_pairs", "all_dup(", ";", ",",
            "|", " and ", " not ", "type == ", '"a"', "\n", " per data.k", " every 4us"],
}

NESTING = {  # text with n levels of each language's brackets or operators
    "cg1": [lambda n: "NOT(" * n + '[type = "a"]' + ")" * n,
            lambda n: "[" + "(" * n + 'type = "a"' + ")" * n + "]",
            lambda n: "[" + "!" * n + 'type = "a"]',
            lambda n: "[" + " | ".join(['type = "a"'] * n) + "]"],
    "cg2": [lambda n: "(" * n + "a" + ")" * n, lambda n: " ; ".join(["a"] * n),
            lambda n: "NOT(" * n + "a" + ")[b, c]" * n],
    "cg3": [lambda n: "SELECT a.id FROM events AS a WHERE " + "(" * n + "TRUE" + ")" * n,
            lambda n: "SELECT a.id FROM events AS a WHERE " + "NOT " * n + "TRUE",
            lambda n: "SELECT a.id FROM events AS a WHERE a.time > " + "ABS(" * n + "1" + ")" * n,
            lambda n: "SELECT a.id FROM events AS a WHERE a.time > " + "- " * n + "1",
            lambda n: " UNION ALL ".join(["SELECT a.id FROM events AS a"] * n)],
    "cg4": [lambda n: "or{" * n + "a" + "}" * n, lambda n: "a" + " within 1s" * n,
            lambda n: "a{" * n + "}" * n, lambda n: "without a during " * n + "b"],
    "cg5": [lambda n: CLASSES + "profile P = " + "(" * n + "A" + ")" * n,
            lambda n: "class X = " + "not " * n + 'type == "a"\nprofile P = X',
            lambda n: "class X = " + "(" * n + 'type == "a"' + ")" * n + "\nprofile P = X"],
}

TRACE = [Event(f"{t}{i}", "s", t, time, i, {"k": k, "x": {"y": k}})
         for i, (t, time, k) in enumerate([("a", 1, 1), ("b", 1, 2), ("c", 3, 1), ("a", 2, 2),
                                           ("b", 6, 1), ("eva.tick.T", 8, None), ("c", 9, 2)])]
"""In time order but for one event (a2 at 2 after c2 at 3): a late event for a bounded join."""

TALLY: dict[str, Counter[str]] = {}
"""Per language: cases, accepted, rejected (the figures this test reports)."""


@cache
def seeds(group: str) -> list[str]:
    """The valid example queries: what the dialect writes for every subexpression of the
    logistics profiles and of profiles over the random-test classes, and the hand-written ones."""
    lang, spoken = language(group), dialect(group)
    docs = [parse(Path("examples/logistics/profiles.eva").read_text()),
            parse(CLASSES + "class D = type == \"c\" and data.k >= 2 or data.x.y == \"q\"\n"
                  "profile P1 = ((all_dup(((all_dup(A), all_dup(B))_5us)_all_pairs); "
                  "all_dup(D))_3us)_all_pairs\n"
                  "profile P2 = ((all_dup((all_dup(A) | all_dup(T))_all_pairs); "
                  "all_dup(AB))_inf)_all_pairs\n")]
    out = set(HAND_WRITTEN[group])
    for doc in docs:
        for profile in doc.profiles:
            for node in ast.walk(profile.expr):
                if spoken.can_render(node, doc):
                    out.add(spoken.render(node, doc))
    for text in out:
        lang.parse(text)  # a seed is valid: mutations start from real queries
    return sorted(out)


@st.composite
def mutated(draw: st.DrawFn, group: str) -> str:
    text = draw(st.sampled_from(seeds(group)))
    piece = st.one_of(st.sampled_from(TOKENS[group]), st.text(max_size=4))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 16)))
        edit = draw(st.sampled_from(["delete", "insert", "duplicate", "replace"]))
        if edit == "delete":
            text = text[:i] + text[j:]
        elif edit == "insert":
            text = text[:i] + draw(piece) + text[i:]
        elif edit == "duplicate":
            text = text[:j] + text[i:j] * draw(st.integers(1, 40)) + text[j:]
        else:
            text = text[:i] + draw(piece) + text[j:]
    return text


@st.composite
def nested(draw: st.DrawFn, group: str) -> str:
    make = draw(st.sampled_from(NESTING[group]))
    text: str = make(draw(st.integers(1, 200) | st.integers(200, 20_000)))  # up to ~64 KiB
    cut = draw(st.integers(0, 3))  # sometimes unbalanced
    return text[:len(text) - cut] if cut else text


def queries(group: str) -> st.SearchStrategy[str]:
    alphabet = st.characters(codec="utf-8")
    return st.one_of(mutated(group), mutated(group), nested(group),
                     st.text(alphabet, max_size=60),
                     st.text(st.sampled_from("".join(TOKENS[group]) + " \n\t"), max_size=80))


def accept_or_refuse(lang: Language, text: str, tally: Counter[str]) -> None:
    tally["cases"] += 1
    try:
        query = lang.parse(text)
    except NativeQueryError as exc:
        tally["rejected"] += 1
        str(exc)  # the message renders (position within the text or none)
        return
    tally["accepted"] += 1
    evaluator = query.evaluator()
    for event in TRACE:
        try:
            evaluator.push(event)
        except EventRejected as exc:
            assert exc.reason == "late"
        except Exhausted as exc:  # a query whose results multiply: the service ends it
            assert str(exc).startswith(("work_limit", "store_limit"))
            tally["exhausted"] += 1
            return
    evaluator.advance(TRACE[-1].time + 10)


FOUND = {
    "cg2": ["a OR ezT ; (a OR c) AND (T OR  b) ANDa OR ezT  ; (a AND (T OR  b) AND (T OR  b) "
            "ANDa OR ezT  ; (a OR cAdezT ; (a OR c) ANDc) AND (b) ANDc OR e) AND (T ORa AND (T "
            "OR  b) AND (T OR  b) ANDa OR ezT  ; (a OR cAdezT ; (a OR c) ANDc) AND (b) ANDc OR "
            "e) AND (T ORb) ANDc OR ezT  ; (a OR  b) AND Ad"],
    "cg3": ["{:}", "SELECT JOIN e@n AT", "SELECT JOIN e:s AT", "{{:{}}}{\ufffd{",
            "SELECT a.id FROM events AS a WHERE a.k = {:}",
            "SELECT a.id FROM events AS a WHERE a.time > INTERVAL '\x1e5' MICROSECOND"],
}
"""What the coverage-guided campaign (``make fuzz``) found, shrunk: a Snoop query of nested
``AND``/``;`` in the unrestricted context that took 30 s of CPU on TRACE (every level pairs
everything it stored: now ended at the work limit); sqlglot's
AttributeError (``{:}``, a map without a key) and ValueError (``AT`` after a table named with a
parameter, ``@n`` or ``:s``); and the SQL language's own ValueError on an interval's amount that
``str.strip`` reads as blank-padded digits and ``int()`` does not (``'\x1e5'``)."""


@pytest.mark.parametrize(("group", "text"), [(g, t) for g, texts in FOUND.items() for t in texts])
def test_what_the_fuzzing_campaign_found_is_accepted_or_refused(group: str, text: str) -> None:
    try:
        language(group).parse(text)
    except NativeQueryError as refused:
        assert "expected" in str(refused)
    accept_or_refuse(language(group), text, Counter())  # and evaluates if accepted


@pytest.mark.parametrize("group", ["cg1", "cg2", "cg3", "cg4", "cg5"])
def test_every_native_parser_accepts_or_refuses_and_never_crashes(group: str) -> None:
    lang = language(group)
    tally = TALLY.setdefault(group, Counter())

    @settings(max_examples=CASES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(queries(group))
    def prop(text: str) -> None:
        accept_or_refuse(lang, text, tally)

    prop()
    print(f"\n{group} ({lang.name}): {tally['cases']} cases, {tally['accepted']} accepted, "
          f"{tally['rejected']} rejected")
    assert tally["accepted"] > 0 and tally["rejected"] > 0  # neither side is vacuous
