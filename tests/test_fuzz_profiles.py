"""Fuzzing the profile parser: any input is accepted or refused with ``FILE:LINE:COL: error:
found …, expected …`` — never another exception — and what it accepts prints back to itself.

Inputs are token soups over the language's vocabulary and its known troublemakers (huge
numbers, bad escapes, deep nesting), valid documents with random edits, and both as bytes with
bytes that are not UTF-8. Each test is bounded to well under a minute.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva import ast
from eva.parser import ProfileError, parse
from eva.printer import to_text
from tests.test_language import documents

STATS: Counter[str] = Counter()
"""Cases run, accepted and rejected per test, printed by ``pytest -s`` at the end."""

_ERROR = re.compile(r"f\.eva:(\d+):(\d+): error: found .+, expected .+", re.DOTALL)

HEAD = 'class A = type == "a"\nclass B = data.k > 1\nclass T = every 1h\n'

VOCABULARY = [
    # statements and predicates
    "class", "profile", "every", "from", "per", "evaluate", "continuous", "end_of_interval",
    "and", "or", "not", "in", "true", "false", "null", "=", "==", "!=", "<", "<=", ">", ">=",
    "A", "B", "T", "X", "data.k", "type", "subject", "data.", ".", "[", "]", ",",
    # expressions
    "(", ")", ";", "|", "_", "all_dup", "first_dup", "last_dup", "2_dup", "0_dup",
    "all_pairs", "unique_pairs", "repeated_pairs", "all_pair", "first", "[1]", "[0]",
    "5s", "2h", "inf", "0s", "4weeks", "5parsecs", "_2h_all_pairs",
    # numbers, in and out of range
    "1", "-3", "1.5", "1e5", "1e999", "-1e999", "1e-400", "9223372036854775807",
    "9223372036854775808", "-9223372036854775809", "9" * 4400, "1" + "0" * 5000 + "s",
    "9" * 20 + "_dup", "[" + "9" * 5000 + "]", "0" * 5000 + "1s", "1" * 400 + ".5",
    # strings, with good and bad escapes
    '"a"', '"10:00"', '"2026-01-01T00:00:00Z"', '"\\x"', '"\\u12"', '"\\u00e9"', '"\\ud800"',
    '"\\udc00"', '"\\ud83d\\ude00"', '"\\ud83d"', '"\t"', '"caf\u00e9"', '"\\"', '"a\\\\"',
    '"\\n\\t\\/\\b"', '"unterminated', "'a'", '"\ud800"',
    # noise
    "#", "# comment\n", "$", "\\", "\x00", "\u00e9", "\u2028", "\x0b", "\ufeff", "-", "@",
]

tokens = st.lists(st.sampled_from(VOCABULARY), max_size=40)
separators = st.sampled_from([" ", "", "\n", "\t", " \r\n"])


@st.composite
def soups(draw: st.DrawFn) -> str:
    words = draw(tokens)
    text = "".join(w + draw(separators) for w in words)
    return draw(st.sampled_from(["", HEAD, HEAD + "profile P = "])) + text


@st.composite
def nested(draw: st.DrawFn) -> str:
    """Nesting around each limit: and/or chains, not, parentheses, operators, class chains."""
    n = draw(st.sampled_from([1, 2, 49, 50, 51, 99, 100, 101, 102, 400, 2000]))
    shape = draw(st.sampled_from(["and", "or", "not", "parens", "disj", "neg", "sel", "refs"]))
    if shape in ("and", "or"):
        return "class C = " + f" {shape} ".join(f"data.k == {i}" for i in range(n)) + \
            "\nprofile P = C\n"
    if shape == "not":
        return "class C = " + "not " * n + 'type == "a"\nprofile P = C\n'
    if shape == "parens":
        return "class C = " + "(" * n + 'type == "a"' + ")" * n + "\nprofile P = C\n"
    if shape == "refs":
        lines = ['class C0 = type == "a"'] + [f"class C{i} = C{i - 1}" for i in range(1, n)]
        return "\n".join(lines) + f"\nprofile P = C{n - 1}\n"
    expr = "A"
    for _ in range(n):
        expr = {"disj": f"(all_dup({expr}) | last_dup(A))_all_pairs",
                "neg": f"((not {expr})_1s)_all_pairs",
                "sel": f"({expr}[1])_unique_pairs"}[shape]
    return HEAD + f"profile P = {expr}\n"


CORPUS = [
    Path("examples/logistics/profiles.eva").read_text(),
    HEAD + "profile P per data.k evaluate end_of_interval = ((first_dup(A); 2_dup(((not B)_5s)"
    "_all_pairs))_1min)_repeated_pairs\nprofile Q = (((all_dup(A) | last_dup(T))_unique_pairs)"
    "[3])_all_pairs\n",
    'class C = not (type in ["a", 1, -2.5e3, true, null] or data.x.y != "\\u00e9\\n")\n'
    'class D = C and subject >= "s" and not C\nclass E = every 90s from "07:30:15"\n'
    "profile R = ((last_dup(D), all_dup(E))_inf)_all_pairs\n",
]


@st.composite
def edited(draw: st.DrawFn) -> str:
    """A valid document (a fixed one, mostly: generating is slow) with a few random deletions,
    insertions and duplications."""
    fixed = draw(st.integers(0, 4)) > 0
    text = draw(st.sampled_from(CORPUS)) if fixed else to_text(draw(documents()))
    for _ in range(draw(st.integers(1, 3))):
        if not text:
            break
        i = draw(st.integers(0, len(text) - 1))
        j = draw(st.integers(i, min(len(text), i + 12)))
        action = draw(st.sampled_from(["delete", "insert", "duplicate"]))
        if action == "delete":
            text = text[:i] + text[j:]
        elif action == "insert":
            text = text[:i] + draw(st.sampled_from(VOCABULARY)) + text[i:]
        else:
            text = text[:j] + text[i:j] + text[j:]
    return text


@st.composite
def as_bytes(draw: st.DrawFn, texts: st.SearchStrategy[str]) -> bytes:
    """A text as a file's bytes, sometimes with a byte that is not UTF-8 put in."""
    data = draw(texts).encode("utf-8", errors="surrogatepass")
    if data and draw(st.booleans()):
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.sampled_from([b"\xe9", b"\xff", b"\xc3", b"\xed\xa0\x80"])) + \
            data[i:]
    return data


def check(source: str | bytes, test: str) -> None:
    """The property: a ProfileError in the one format, or a document that prints back to
    itself (and whose printed form is a fixed point)."""
    STATS[f"{test}: run"] += 1
    try:
        doc = parse(source, "f.eva")
    except ProfileError as exc:
        STATS[f"{test}: rejected"] += 1
        text = str(exc)
        assert _ERROR.fullmatch(text.split("\n  ")[0]), text
        assert exc.line >= 1 and exc.column >= 1, text
        return
    STATS[f"{test}: accepted"] += 1
    printed = to_text(doc)
    again = parse(printed)
    assert again == doc
    assert to_text(again) == printed
    assert isinstance(doc, ast.Document)


FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(source=soups())
def test_token_soup_is_accepted_or_refused_in_the_one_format(source: str) -> None:
    check(source, "soup")


@FUZZ
@given(source=edited())
def test_edited_documents_are_accepted_or_refused_in_the_one_format(source: str) -> None:
    check(source, "edited")


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(source=nested())
def test_nesting_at_and_past_the_limits_is_accepted_or_refused_in_the_one_format(
        source: str) -> None:
    check(source, "nested")


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(source=as_bytes(st.one_of(soups(), edited())))
def test_file_bytes_are_accepted_or_refused_in_the_one_format(source: bytes) -> None:
    check(source, "bytes")


def test_zz_report_fuzz_statistics() -> None:
    """Prints the counts (visible with ``pytest -s``); runs last in this module."""
    for key in sorted(STATS):
        print(f"{key}: {STATS[key]}")
