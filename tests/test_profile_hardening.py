"""Profiles that used to crash the parser, the printer or the engine (issue 11): each is now
refused with ``FILE:LINE:COL: error: found …, expected …`` (exit 2 from ``evamed``), and a
profile just below each documented limit works end to end — parse, print, parse, an engine
built and fed an event — even with hundreds of frames already on the stack."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from typer.testing import CliRunner

from eva import ast
from eva.engine import Engine, EngineConfig
from eva.events import Event
from eva.parser import ProfileError, parse
from eva.printer import to_text
from eva.reference import evaluate
from eva.semantics import Notification
from eva.units import MAX_SPAN, parse_span
from eva.validate import (
    MAX_DOCUMENT_BYTES,
    MAX_EXPRESSION_DEPTH,
    MAX_EXPRESSION_OPERATORS,
    MAX_IN_VALUES,
    MAX_PREDICATE_DEPTH,
    MAX_PREDICATE_TERMS,
)
from mediator.cli import app

runner = CliRunner()
A = 'class A = type == "a"\n'
T = TypeVar("T")


def error_of(source: str | bytes) -> ProfileError:
    with pytest.raises(ProfileError) as info:
        parse(source, "p.eva")
    exc = info.value
    assert str(exc).startswith(f"p.eva:{exc.line}:{exc.column}: error: found "), str(exc)
    assert ", expected " in exc.message
    return exc


def at(source: str | bytes, line: int, column: int, *words: str) -> None:
    exc = error_of(source)
    assert (exc.line, exc.column) == (line, column), str(exc)
    for word in words:
        assert word in exc.message, str(exc)


# ------------------------------------------------------------------ files that are not UTF-8


def test_a_byte_that_is_not_utf8_is_reported_at_its_line_and_column() -> None:
    data = b'class A = type == "caf\xe9"\nprofile P = A\n'
    at(data, 1, 23, "0xe9", "not UTF-8", "expected a UTF-8 text file")
    at(b'class A = type == "\xc3\xa9"\n# \xff\n', 2, 3, "0xff")


def test_a_byte_order_mark_is_ignored() -> None:
    assert parse("\ufeff".encode() + A.encode()).classes[0].name == "A"


# ------------------------------------------------------------------ string literals


@pytest.mark.parametrize(("literal", "column", "words"), [
    ('"\\x"', 20, ["'\\x'", "expected one of"]),
    ('"\\u12"', 20, ["'\\u12\"'", "four hexadecimal digits"]),
    ('"a\tb"', 21, ["U+0009", "escaped"]),
    ('"\\ud800"', 20, ["lone surrogate", "\\ud800"]),
    ('"\\udc00x"', 20, ["lone surrogate"]),
    ('"ok\\ud83dx"', 22, ["lone surrogate"]),
    ('"\ud800"', 20, ["U+D800"]),
])
def test_bad_escapes_are_reported_at_the_backslash(literal: str, column: int,
                                                   words: list[str]) -> None:
    at(f"class A = type == {literal}\n", 1, column, *words)


def test_a_bad_escape_in_a_time_anchor_is_reported_at_the_backslash() -> None:
    at('class T = every 1h from "\\x"\n', 1, 26, "'\\x'")


def test_escapes_decode_as_in_json_and_a_surrogate_pair_is_one_character() -> None:
    doc = parse('class A = data.s in ["\\"\\\\\\/\\b\\f\\n\\r\\t", "\\u00e9", "\\ud83d\\ude00"]\n')
    body = doc.classes[0].body
    assert isinstance(body, ast.Compare)
    assert body.value == ('"\\/\b\f\n\r\t', "é", "\U0001f600")
    assert parse(to_text(doc)) == doc


def test_an_unterminated_string_says_so() -> None:
    at('class A = type == "a\n', 1, 19, "unterminated string")


# ------------------------------------------------------------------ numbers


@pytest.mark.parametrize(("source", "words"), [
    (A + f"profile P = ((all_dup(A); all_dup(A))_{'1' * 4400}s)_all_pairs\n", ["at most"]),
    (A + f"profile P = (({'1' * 4400}_dup(A); all_dup(A))_1s)_all_pairs\n", ["64-bit"]),
    (A + f"profile P = (A[{'1' * 4400}])_all_pairs\n", ["64-bit"]),
    (f"class A = data.k == {'1' * 4400}\n", ["64-bit"]),
    (f"class A = data.k in [1, -{'1' * 4400}]\n", ["64-bit"]),
    (f"class T = every {'1' * 4400}h\n", ["at most"]),
    ("class A = data.k == 9223372036854775808\n", ["64-bit"]),
    ("class A = data.k == -9223372036854775809\n", ["64-bit"]),
    ("class A = data.k == 1e999\n", ["finite"]),
    ("class A = data.k == -1e999\n", ["finite"]),
    (f"class A = data.k == {'9' * 400}.0\n", ["finite"]),
    (A + "profile P = (A[9223372036854775808])_all_pairs\n", ["64-bit"]),
    (A + f"profile P = ((all_dup(A); all_dup(A))_{MAX_SPAN + 1}us)_all_pairs\n", ["at most"]),
])
def test_numbers_past_their_bound_are_refused_with_the_bound(source: str,
                                                             words: list[str]) -> None:
    exc = error_of(source)
    for word in words:
        assert word in exc.message, str(exc)


def test_numbers_at_their_bound_are_accepted_and_print_back() -> None:
    doc = parse(A + "class B = data.k in [9223372036854775807, -9223372036854775808, 1.7e308, "
                "-0.0, 5e-324]\n"
                f"profile P = ((9223372036854775807_dup(A); all_dup(A))_{MAX_SPAN}us)_all_pairs\n"
                "profile Q = (A[9223372036854775807])_all_pairs\n"
                f"profile R = ((all_dup(A), all_dup(A))_{'0' * 5000}1s)_all_pairs\n")
    assert parse(to_text(doc)) == doc
    r = doc.profile("R").expr
    assert isinstance(r, ast.Conjunction) and r.span == 1_000_000


def test_parse_span_refuses_past_the_bound_with_a_value_error() -> None:
    assert parse_span(f"{MAX_SPAN}us") == MAX_SPAN
    for text in (f"{MAX_SPAN + 1}us", "9" * 5000 + "s", "5parsecs", "s"):
        with pytest.raises(ValueError, match="found"):
            parse_span(text)


def test_the_printer_refuses_values_the_language_cannot_write() -> None:
    for value in (math.inf, math.nan, "\ud800", 2**63):
        doc = ast.Document((ast.ClassDef("A", ast.Compare("data.k", "==", value)),), ())
        with pytest.raises(ValueError):
            to_text(doc)


# ------------------------------------------------------------------ nesting and size limits


def chain(op: str, terms: int) -> str:
    return "class C = " + f" {op} ".join(f"data.k == {i}" for i in range(terms)) + "\n"


def nots(n: int) -> str:
    return "class C = " + "not " * n + "data.k == 0\n"


def references(n: int) -> str:
    """C0 … C{n-1}, each the previous one: the last is n - 1 references deep."""
    return "\n".join(["class C0 = data.k == 0"] +
                     [f"class C{i} = C{i - 1}" for i in range(1, n)]) + "\n"


def balanced_predicate(terms: int) -> str:
    """A class of ``terms`` comparisons or-ed as a balanced tree: about log2(terms) deep."""
    parts = [f"data.k == {i}" for i in range(terms)]
    while len(parts) > 1:
        pairs = [f"({a} or {b})" for a, b in zip(parts[::2], parts[1::2], strict=False)]
        parts = pairs + (parts[-1:] if len(parts) % 2 else [])
    return f"class C = {parts[0]}\n"


def nested(kind: str, n: int) -> str:
    expr = "A"
    for _ in range(n):
        expr = {"disjunction": f"(all_dup({expr}) | last_dup(A))_all_pairs",
                "negation": f"((not {expr})_1s)_all_pairs",
                "sequence": f"((first_dup(A); all_dup({expr}))_5s)_unique_pairs",
                "selection": f"({expr}[1])_all_pairs"}[kind]
    return A + f"profile P = {expr}\n"


def balanced(operators: int) -> str:
    """A profile of exactly ``operators`` disjunctions, as shallow as possible."""
    parts = ["A"] * (operators + 1)
    while len(parts) > 1:
        pairs = [f"(all_dup({a}) | all_dup({b}))_all_pairs" for a, b in zip(
            parts[::2], parts[1::2], strict=False)]
        parts = pairs + (parts[-1:] if len(parts) % 2 else [])
    return A + f"profile P = {parts[0]}\n"


@pytest.mark.parametrize(("source", "words"), [
    (A + "profile P = C\n" + chain("and", 993), ["nested 992 levels", "'in [...]'"]),
    (chain("or", 993) + "profile P = C\n", ["nested 992 levels"]),
    (chain("and", 400) + "profile P = C\n", ["nested 399 levels"]),
    (nots(491) + "profile P = C\n", ["nested 491 levels"]),
    (references(331) + "profile P = C330\n", ["class 'C101'", "nested 101 levels"]),
    (nested("disjunction", 246), ["nested 246 deep"]),
    (nested("negation", 491), ["nested 491 deep"]),
    (nested("selection", 2000), ["nested 2000 deep"]),
])
def test_deep_nesting_is_refused_with_the_limit(source: str, words: list[str]) -> None:
    exc = error_of(source)
    for word in words:
        assert word in exc.message, str(exc)


def test_a_class_that_doubles_its_reference_is_refused_before_it_is_written_out() -> None:
    lines = ["class C0 = data.k == 0"] + [f"class C{i} = C{i - 1} or C{i - 1}"
                                       for i in range(1, 80)]
    exc = error_of("\n".join(lines) + "\nprofile P = C79\n")
    assert f"expected at most {MAX_PREDICATE_TERMS}" in exc.message and "C10" in exc.message


def test_a_cycle_is_named_without_recursing() -> None:
    lines = [f"class C{i} = C{i + 1}" for i in range(5000)] + ["class C5000 = C0"]
    exc = error_of("\n".join(lines) + "\n")
    assert "C0 → C1 → C2" in exc.message and "refers to itself" in exc.message


def test_the_limits_are_just_past_what_the_previous_sizes_reach() -> None:
    """A document one step past each limit is refused; the ones at it are accepted below."""
    error_of(chain("or", MAX_PREDICATE_DEPTH + 2) + "profile P = C\n")
    error_of(nots(MAX_PREDICATE_DEPTH + 1) + "profile P = C\n")
    error_of(references(MAX_PREDICATE_DEPTH + 2) + "profile P = C\n")
    error_of(nested("sequence", MAX_EXPRESSION_DEPTH + 1))
    error_of(balanced(MAX_EXPRESSION_OPERATORS + 1))
    error_of(balanced_predicate(MAX_PREDICATE_TERMS + 1) + "profile P = C\n")


def call_with_frames(frames: int, fn: Callable[[], T]) -> T:
    """``fn()`` with ``frames`` more frames on the stack: the margin the limits leave."""
    return fn() if frames <= 0 else call_with_frames(frames - 1, fn)


def end_to_end(source: str) -> list[Notification]:
    """Parse, print, parse; build an engine and feed it an event of type a with k = 0."""
    doc = parse(source, "p.eva")
    text = to_text(doc)
    assert parse(text) == doc and to_text(parse(text)) == text
    engine = Engine(EngineConfig())
    engine.add_document(doc)
    out = list(engine.push(Event("a1", "s", "a", 1_000_000, 0, {"k": 0})))
    out += engine.close(10_000_000)
    return out


@pytest.mark.parametrize("source", [
    pytest.param(chain("or", MAX_PREDICATE_DEPTH + 1) + "profile P = C\n", id="or-chain"),
    pytest.param("class C = " + " and ".join(f"data.k > -{i + 1}"
                                             for i in range(MAX_PREDICATE_DEPTH + 1)) +
                 "\nprofile P = C\n", id="and-chain"),
    pytest.param(nots(MAX_PREDICATE_DEPTH) + "profile P = C\n", id="nots"),
    pytest.param(references(MAX_PREDICATE_DEPTH + 1) + f"profile P = C{MAX_PREDICATE_DEPTH}\n",
                 id="references"),
    pytest.param(balanced_predicate(MAX_PREDICATE_TERMS) + "profile P = C\n", id="terms"),
    pytest.param(nested("disjunction", MAX_EXPRESSION_DEPTH), id="disjunctions"),
    pytest.param(nested("negation", MAX_EXPRESSION_DEPTH), id="negations"),
    pytest.param(nested("sequence", MAX_EXPRESSION_DEPTH), id="sequences"),
    pytest.param(nested("selection", MAX_EXPRESSION_DEPTH), id="selections"),
    pytest.param(balanced(MAX_EXPRESSION_OPERATORS), id="operators"),
])
def test_a_profile_at_each_limit_runs_end_to_end_with_frames_to_spare(source: str) -> None:
    out = call_with_frames(300, lambda: end_to_end(source))
    if "class C" in source and "nots" not in source:
        assert out, "the event matches the class"


def test_a_profile_at_the_limits_agrees_with_the_reference_evaluator() -> None:
    source = chain("or", MAX_PREDICATE_DEPTH + 1) + "profile P = C\n"
    doc = parse(source)
    trace = [Event("a1", "s", "a", 1_000_000, 0, {"k": 7})]
    assert [n.occ.time for n in evaluate(doc, trace)] == [1_000_000]
    assert call_with_frames(300, lambda: end_to_end(nested("disjunction",
                                                               MAX_EXPRESSION_DEPTH)))


# ------------------------------------------------------------------ messages


@pytest.mark.parametrize(("expr", "column", "words"), [
    ("(Scanned ; not Delivered)_2h", 14,
     ["operand 'Scanned' without a duplicate selection", "'all_dup(Scanned)'"]),
    ("((all_dup(Scanned); all_dup((not Delivered)_2h))_2h)_all_pairs", 41,
     ["'(not Delivered)_2h' without a consumption", "'((not Delivered)_2h)_all_pairs'"]),
    ("((all_dup(Scanned); not Delivered)_2h)_all_pairs", 33,
     ["a negation 'not Delivered' without a duplicate selection",
      "all_dup(((not Delivered)_<span>)_all_pairs)"]),
    ("((all_dup(Scanned); all_dup(Delivered))_2h)", 56,
     ["found end of input after", "expected _all_pairs, _unique_pairs or _repeated_pairs",
      "a sequence is written ((D(E1); D(E2))_span)_pairs"]),
    ("((all_dup(Scanned); all_dup(Delivered))_all_pairs)_all_pairs", 52,
     ["found '_all_pairs', expected a time span"]),
    ("(all_dup(Scanned) | all_dup(Delivered))_2h", 52, ["a disjunction is written"]),
    ("((not Delivered)_2h_all_pairs)", 32,
     ["found '_all_pairs' right after '_2h', expected a ')' between them"]),
    ("((all_dup(Scanned); all_dup(Delivered); all_dup(Scanned))_2h)_all_pairs", 51,
     ["a third operand"]),
    ("((all_dup(Scanned))_2h)_all_pairs", 31, ["expected ';', ',' or '|'"]),
    ("(Scanned)", 13, ["'Scanned' in parentheses"]),
    ("((all_dup(Scanned), all_dup(Delivered))_2h)_all_pair", 57, ["did you mean 'all_pairs'"]),
    ("((first(Scanned); all_dup(Delivered))_2h)_all_pairs", 20,
     ["only a duplicate selection"]),
    ("Scanned and Delivered", 21, ["and/or combine predicates in a class definition"]),
])
def test_a_malformed_operator_is_named_with_what_is_missing(expr: str, column: int,
                                                            words: list[str]) -> None:
    source = 'class Scanned = type == "s"\nclass Delivered = type == "d"\nprofile P = ' + expr
    at(source, 3, column, *words)


def test_the_caret_line_is_cut_around_the_column_of_a_long_line() -> None:
    exc = error_of("class A = " + " or ".join(f"data.k == {i}" for i in range(200)) + " $\n")
    _, code, caret = str(exc).split("\n")
    assert len(code) < 120 and code[len(caret) - 1] == "$"


# ------------------------------------------------------------------ sizes


def in_list(values: int) -> str:
    return f"class A = data.k in [{', '.join(str(i) for i in range(values))}]\nprofile P = A\n"


def test_an_in_list_at_its_limit_is_accepted_and_one_more_value_is_refused() -> None:
    doc = parse(in_list(MAX_IN_VALUES))
    assert parse(to_text(doc)) == doc
    at(in_list(MAX_IN_VALUES + 1), 1, 1, f"{MAX_IN_VALUES + 1:,} values", f"{MAX_IN_VALUES:,}")


def test_a_document_past_its_size_limit_is_refused_before_it_is_parsed() -> None:
    """A 2.4 MB 'in' list took 6.9 s and 288 MB; the size is checked before lark sees a byte
    (the comment would parse: only the size refuses it)."""
    text = "# " + "x" * MAX_DOCUMENT_BYTES + "\n"
    for source in (text, text.encode()):
        exc = error_of(source)
        assert (exc.line, exc.column) == (1, 1) and f"{MAX_DOCUMENT_BYTES:,} bytes" in exc.message


def test_evamed_check_reads_no_more_of_a_huge_file_than_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "p.eva"
    with path.open("wb") as file:
        file.truncate(4 * MAX_DOCUMENT_BYTES)  # sparse: 64 MiB of NUL bytes, none read past the limit
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 2 and f"{path}:1:1: error: found a document of more" in result.output


# ------------------------------------------------------------------ the command line


@pytest.mark.parametrize(("content", "where"), [
    (b'class A = type == "caf\xe9"\nprofile P = A\n', ":1:23: error: found the byte 0xe9"),
    (b'class A = type == "\\x"\n', ":1:20: error: found the escape"),
    (chain("and", 400).encode() + b"profile P = C\n", ":1:1: error: found the predicate"),
    (nested("disjunction", 246).encode(), ":2:1: error: found operators nested 246 deep"),
    (b"class A = data.k == " + b"9" * 5000 + b"\n", ":1:21: error: found '9999"),
])
def test_evamed_check_and_replay_exit_2_with_the_position(tmp_path: Path, content: bytes,
                                                          where: str) -> None:
    path = tmp_path / "p.eva"
    path.write_bytes(content)
    events = tmp_path / "e.jsonl"
    events.write_text("")
    for args in (["check", str(path)], ["replay", "--profiles", str(path), "--events",
                                         str(events)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert f"{path}{where}" in result.output
        assert "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
