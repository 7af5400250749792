"""Every reader of client text takes time linear in its input (issue 28, item 1): the profile
reader (its direct reader and lark's), the native query readers of the base services and the
event decoder, each fed the shapes that made one of them quadratic or worse — runs of blanks,
comments, brackets, long strings with and without their end, long identifiers.

Each shape is read at a ladder of sizes, each four times the one before, and the CPU time of
each read must stay under eight times the one before: linear growth gives about four (less,
with the fixed costs), quadratic sixteen. No wall-clock bound: the ratio holds on a slow or busy
machine. The top of the ladder is 16 MiB (the profile document limit) where reading stays quick;
shapes only lark reads (about 10 s a MiB for the deepest nesting) stop at 256 KiB or 1 MiB, and
native queries at their 64 KiB limit. Each case also checks the outcome: the document read, or
the error as precise as before (line, column, what was expected).
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

from adapters.backends.native import MAX_QUERY_BYTES, NativeQueryError
from adapters.backends.registry import language
from eva.events import EventError, from_json_line
from eva.parser import ProfileError, parse

MIB = 1 << 20
GROWTH = 4
"""The larger input is this many times the smaller."""
MOST = 8.0
"""The most the time may grow: twice linear (quadratic would be 16)."""
FLOOR = 0.04
"""Seconds of CPU a measurement lasts at least (a quick read is repeated), so that the clock's
resolution and the call overhead do not decide the ratio."""
LONG = 0.25
"""A read this long is measured once: its own length smooths the noise."""
SMALLEST = 4096
"""The ladder of sizes starts here (or at the first that is not smaller): quadratic growth
shows within a few steps, before a read takes long."""
CACHE = 2 * MIB
"""About what the CPU's cache holds (L2 is 2 MiB a core here). A read that costs a nanosecond a
byte is memory-bound: once the input outgrows the cache it costs up to five times more a byte
(orjson refusing a line of brackets: 0.11 ms a MiB at 1 MiB, 0.56 at 4 MiB, 0.69 at 16 MiB).
So the step across this size is not compared; the steps on either side are."""
TRIES = 3
"""Measurements of a pair of sizes, the smallest ratio counts: a read that touches a few MiB is
memory-bound, and where the kernel puts a buffer (huge pages or not) can change its time by half
from one buffer to the next — never by four times, as quadratic growth does at every try."""


def cpu_time(read: Callable[[], Any]) -> float:
    """CPU seconds of one ``read``: once if that is long, else the least of three measurements,
    each of enough repeats to last ``FLOOR``."""
    start = time.process_time()
    read()
    once = time.process_time() - start
    if once >= LONG:
        return once
    repeats = int(FLOOR / max(once, 1e-6)) + 1
    best = float("inf")
    for _ in range(3):
        gc.collect()
        start = time.process_time()
        for _ in range(repeats):
            read()
        best = min(best, (time.process_time() - start) / repeats)
    return best


def outcome(read: Callable[[Any], Any], text: Any) -> str:
    """"ok", or the first line of the error ``read`` raises."""
    try:
        read(text)
    except (ProfileError, NativeQueryError, EventError) as exc:
        return str(exc).split("\n")[0]
    return "ok"


def assert_linear(read: Callable[[Any], Any], shape: Callable[[int], Any], size: int) -> None:
    """Each of a ladder of sizes from ``SMALLEST`` up to ``size``, each ``GROWTH`` times the
    one before, takes less than ``MOST`` times as long as the one before (but the step out of
    the cache): a reader that is not linear fails at a small step, in seconds, instead of
    taking hours over the big one."""
    sizes = [size]
    while sizes[0] // GROWTH >= SMALLEST:
        sizes.insert(0, sizes[0] // GROWTH)
    def measured(size: int) -> float:
        text = shape(size)
        return cpu_time(lambda: outcome(read, text))

    previous = measured(sizes[0])
    for smaller, larger in itertools.pairwise(sizes):
        if smaller <= CACHE < larger:
            previous = measured(larger)  # a step out of the cache (see CACHE): not compared
            continue
        tries = []
        for attempt in range(TRIES):
            if attempt:
                previous = measured(smaller)
            took = measured(larger)
            tries.append(f"{previous * 1000:.1f} ms, then {took * 1000:.1f} ms")
            if took / previous < MOST:
                break
        else:
            raise AssertionError(f"{larger:,} characters took more than {MOST} times as long as "
                                 f"{smaller:,}: " + "; ".join(tries))
        previous = took


# ------------------------------------------------------------------ the profile reader

A = 'class A = type == "a"\n'
INFLOW = 'class inflow = type == "a"\n'
"""A class whose name starts like the span 'inf': the direct reader leaves such a document to
lark, so the shapes after it are lark's to read."""

PROFILES: dict[str, tuple[int, Callable[[int], str], str]] = {
    # name: (big size, the document of a size, its outcome)
    "blanks after the last profile (the issue's case)":
        (16 * MIB, lambda n: A + "profile P = A" + " " * n, "ok"),
    "blanks after a profile, then a comment without its newline":
        (16 * MIB, lambda n: A + "profile P = A" + " " * n + "# end", "ok"),
    "blanks after a profile, then what no token is":
        (16 * MIB, lambda n: A + "profile P = A" + " " * n + "{", "error: found '{', expected"),
    "blank lines after a profile": (16 * MIB, lambda n: A + "profile P = A" + "\n" * n, "ok"),
    "comment lines": (16 * MIB, lambda n: A + "profile P = A\n" + "# c\n" * (n // 4), "ok"),
    "blanks inside a profile": (16 * MIB, lambda n: A + "profile P =" + " " * n + "A", "ok"),
    "a long string": (16 * MIB, lambda n: 'class A = type == "' + "a" * n + '"\nprofile P = A',
                      "ok"),
    "a string of escaped quotes without its end":
        (16 * MIB, lambda n: 'class A = type == "' + '\\"' * (n // 2),
         "1:19: error: found an unterminated string"),
    "a long string without its end":
        (16 * MIB, lambda n: 'class A = type == "' + "a" * n,
         "1:19: error: found an unterminated string"),
    "a run of quotes": (4 * MIB, lambda n: 'class A = type == ' + '"' * n,
                        "1:21: error: found '\"\"', expected"),
    "a long name": (16 * MIB, lambda n: "class " + "A" * n + ' = type == "a"\nprofile P = '
                    + "A" * n, "ok"),
    "a long number": (16 * MIB, lambda n: "class A = data.x == " + "1" * n,
                      "1:21: error: found '1111"),
    "blanks after a profile lark reads":
        (16 * MIB, lambda n: INFLOW + "profile P = inflow" + " " * n, "ok"),
    "comment lines lark reads":
        (MIB, lambda n: INFLOW + "profile P = inflow\n" + "# c\n" * (n // 4), "ok"),
    "a string of escaped quotes lark reads":
        (16 * MIB, lambda n: 'class inflow = type == "' + '\\"' * (n // 2) + '"\nprofile P = inflow',
         "ok"),
    "opening brackets": (MIB // 4, lambda n: "profile P = " + "(" * n,
                         "error: found end of input, expected a name, a duplicate selection"),
    "closing brackets": (MIB // 4, lambda n: A + "profile P = A" + ")" * n,
                         "2:14: error: found ')', expected 'class', 'profile' or end of input"),
    "brackets around a predicate":
        (MIB // 4, lambda n: "class C = " + "(" * (n // 2) + "x == 1" + ")" * (n // 2)
         + "\nprofile P = C", "ok"),
    "operators nested deep":
        (MIB // 4, lambda n: A + "profile P = " + "(first_dup(" * (n // 36) + "A"
         + ")|first_dup(A))_all_pairs" * (n // 36),
         "error: found operators nested"),
    "a long chain of 'or'": (MIB // 4, lambda n: "class C = " + "x == 1 or " * (n // 10) + "x == 1",
                             "error: found the predicate of class 'C' nested"),
}


@pytest.mark.parametrize("name", PROFILES)
def test_the_profile_reader_is_linear(name: str) -> None:
    size, shape, expected = PROFILES[name]
    assert expected in outcome(parse, shape(5000)), outcome(parse, shape(5000))
    assert_linear(parse, shape, size)


# ------------------------------------------------------------------ native queries

FILTER = '[type = "a"]'
SQL = "SELECT x.id FROM events AS x WHERE x.type = 'a'"

QUERIES: dict[str, tuple[str, Callable[[int], str], str]] = {
    # name: (group, the query of a size, its outcome)
    "cg0 blanks after": ("cg0", lambda n: FILTER + " " * n, "ok"),
    "cg1 blanks after": ("cg1", lambda n: FILTER + " " * n, "ok"),
    "cg1 blanks, then what no token is": ("cg1", lambda n: FILTER + " " * n + "{",
                                          "unexpected character '{'"),
    "cg1 a long string": ("cg1", lambda n: '[type = "' + "a" * n + '"]', "ok"),
    "cg1 a string of escaped quotes without its end":
        ("cg1", lambda n: '[type = "' + '\\"' * (n // 2), "1:9: error: unexpected character"),
    "cg1 a run of backslashes": ("cg1", lambda n: '[type = "' + "\\" * (n | 1) + '"]',
                                 "1:9: error: unexpected character"),
    "cg1 a long path": ("cg1", lambda n: "[data" + ".a" * (n // 2) + " = 1]", "ok"),
    "cg1 a long chain of &": ("cg1", lambda n: "[" + '(type = "a") & ' * (n // 16) + 'type = "a"]',
                              "ok"),
    "cg1 a long in list": ("cg1", lambda n: "[data.x in [" + "1," * (n // 2) + "1]]", "ok"),
    "cg1 a run of !": ("cg1", lambda n: "[" + "!" * n + 'type = "a"]', "nests deeper than"),
    "cg2 blanks after": ("cg2", lambda n: "a ; b" + " " * n, "ok"),
    "cg2 a long sequence": ("cg2", lambda n: "a" + " ; a" * (n // 4), "nests deeper than"),
    "cg2 a quoted type without its end": ("cg2", lambda n: 'a ; "' + "b" * n,
                                          "1:5: error: unexpected character"),
    "cg3 blanks after": ("cg3", lambda n: SQL + " " * n, "ok"),
    "cg3 comment lines": ("cg3", lambda n: SQL + "\n" + "-- c\n" * (n // 5), "ok"),
    "cg3 a long comment": ("cg3", lambda n: SQL + " /*" + "x" * n + "*/", "ok"),
    "cg3 a comment without its end": ("cg3", lambda n: SQL + " /*" + "x" * n,
                                      "unterminated comment"),
    "cg3 doubled quotes": ("cg3", lambda n: SQL[:-1] + "''" * (n // 2) + "'", "ok"),
    "cg3 a string without its end": ("cg3", lambda n: SQL[:-1] + "a" * n, "unterminated quote"),
    "cg3 a long name": ("cg3", lambda n: SQL + " AND x." + "a" * n + " = 1", "ok"),
    "cg3 a long chain of AND": ("cg3", lambda n: SQL + " AND x.type = 'a'" * (n // 17), "ok"),
    "cg3 a long IN list": ("cg3", lambda n: SQL + " AND x.time IN (" + "1," * (n // 2) + "1)", "ok"),
    "cg3 join words in a comment before an outer join":
        ("cg3", lambda n: "SELECT x.id FROM events AS x /* " + "LEFT " * (n // 5)
         + "*/ LEFT JOIN b AS y ON TRUE", "error: only inner joins"),
    "cg4 blanks after": ("cg4", lambda n: "and{ a, b } within 2h" + " " * n, "ok"),
    "cg4 a long list": ("cg4", lambda n: "and{" + "a," * (n // 2) + "a} within 2h", "ok"),
    "cg4 a string without its end": ("cg4", lambda n: 'a{"' + "x" * n,
                                     "1:3: error: unexpected character"),
    "cg4 blanks inside a duration": ("cg4", lambda n: "a within 2" + " " * n + "x",
                                     "error: found '2', expected a duration"),
    "cg5 blanks after": ("cg5", lambda n: A + "profile P = A" + " " * n, "ok"),
    "cg5 a string of escaped quotes without its end":
        ("cg5", lambda n: 'class A = x == "' + '\\"' * (n // 2), "unterminated string"),
}


@pytest.mark.parametrize("name", QUERIES)
def test_the_native_query_readers_are_linear(name: str) -> None:
    group, shape, expected = QUERIES[name]
    read = language(group).parse

    def query(n: int) -> str:
        return shape(n)[:MAX_QUERY_BYTES - 1]

    assert expected in outcome(read, query(5000)), outcome(read, query(5000))
    assert_linear(read, query, MAX_QUERY_BYTES)


# ------------------------------------------------------------------ the event decoder

HEAD = '{"specversion":"1.0","id":"1","source":"s","type":"t","time":"2024-01-01T00:00:00Z"'

EVENTS: dict[str, tuple[Callable[[int], str], str]] = {
    "blanks after": (lambda n: HEAD + "}" + " " * n, "ok"),
    "blanks before": (lambda n: " " * n + HEAD + "}", "ok"),
    "blanks, then what is not JSON": (lambda n: HEAD + "}" + " " * n + "x", "not JSON: Extra data"),
    "a long string": (lambda n: HEAD + ',"data":"' + "a" * n + '"}', "ok"),
    "escapes": (lambda n: HEAD + ',"data":"' + "\\n" * (n // 2) + '"}', "ok"),
    "a string of escaped quotes without its end":
        (lambda n: HEAD + ',"data":"' + '\\"' * (n // 2), "not JSON: Unterminated string"),
    "lone surrogates": (lambda n: HEAD + ',"x":"' + "\\ud800" * (n // 6) + '"}',
                        "unpaired surrogate"),
    "a long key": (lambda n: HEAD + ',"' + "k" * n + '":1}', "ok"),
    "many keys": (lambda n: HEAD + "".join(f',"k{i}":1' for i in range(n // 10)) + "}", "ok"),
    "a long number": (lambda n: HEAD + ',"data":' + "1" * n + "}", "an integer of more than"),
    "runs of 19 digits": (lambda n: HEAD + ',"data":[' + ",".join(["12345678901234567890"] * (n // 21))
                          + "]}", "ok"),
    "a long array": (lambda n: HEAD + ',"data":[' + "1," * (n // 2) + "1]}", "ok"),
    "opening brackets": (lambda n: HEAD + ',"data":' + "[" * n, "JSON nested deeper than"),
    "brackets in a string": (lambda n: HEAD + ',"data":"' + "[{" * (n // 2) + '"}', "ok"),
}


@pytest.mark.parametrize("name", EVENTS)
def test_the_event_decoder_is_linear(name: str) -> None:
    shape, expected = EVENTS[name]
    assert expected in outcome(from_json_line, shape(5000)), outcome(from_json_line, shape(5000))
    assert_linear(from_json_line, lambda n: shape(n).encode(), 16 * MIB)
