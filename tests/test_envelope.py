"""The common envelope's reader (eva/envelope.py, ``events._enveloped``) against the general
one: on every line it takes, the same event — identity, time, data, attributes — or the same
error; on a line it leaves, the general path reads it (``read_lines`` gives what
``from_json_line`` gives, line for line). Lines are CloudEvents of random attributes and data
(big integers, deep nesting, escapes, non-ASCII, NaN), written with keys in any order, some
repeated, then mutated a byte at a time."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eva import events
from eva.events import Event, EventError, from_json_line, read_lines, read_texts

FUZZ = settings(max_examples=1500, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

texts = st.text(st.sampled_from(['a', 'Z', '7', ' ', '"', '\\', "'", '\n', '\t', 'é', '\u2028',
                                 '\ud800', '{', '[']), max_size=6)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                    st.integers(10**18, 10**40), st.integers(-10**40, -10**18), texts)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)), max_leaves=10)
deep = st.integers(95, 105).map(lambda n: "[" * n + "]" * n)
TIMES = ["2026-03-02T10:00:00Z", "2026-03-02T10:00:00.123Z", "2026-03-02T10:00:00.5+02:00",
         "2026-02-30T10:00:00Z", "2026-03-02T10:00:60Z", "2026-03-02 10:00:00", ""]


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    members: list[tuple[str, str]] = []
    for name, usual in (("specversion", '"1.0"'), ("id", '"e1"'), ("source", '"urn:s"'),
                        ("type", '"t"'), ("time", json.dumps(TIMES[0]))):
        choice = draw(st.integers(0, 9))
        if choice == 0:
            continue  # absent
        if choice == 1:
            members.append((name, draw(st.sampled_from(['""', '1', 'null', '"2.0"', '"\\u00e9"',
                                                        '"a\\"b"', '"\\ud800"']))))
        elif choice == 2 and name == "time":
            members.append((name, json.dumps(draw(st.sampled_from(TIMES)))))
        else:
            members.append((name, usual))
    choice = draw(st.integers(0, 4))
    if choice:
        data = draw(deep) if choice == 1 else json.dumps(
            draw(values), ensure_ascii=draw(st.booleans()))
        members.append(("data", data))
    if draw(st.integers(0, 4)) == 0:
        members.append((draw(st.sampled_from(["subject", "data", "id", "x"])),
                        json.dumps(draw(values))))
    members = draw(st.permutations(members))
    text = "{" + ",".join(f'"{name}":{value}' for name, value in members) + "}"
    raw = text.encode("utf-8", "surrogatepass")
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(raw)))
        raw = raw[:i] + draw(st.sampled_from([b"", b"1", b"\xff", b",", b"}", b" "])) \
            + raw[i + 1:]
    return raw


def general(line: bytes | str, seq: int) -> Event | EventError:
    try:
        return from_json_line(line, seq)
    except EventError as exc:
        return exc


def described(result: Event | EventError) -> Any:
    """What a result says: an event's fields, data and attributes (``repr``: NaN equals
    itself), or an error's message."""
    if isinstance(result, EventError):
        return ("error", str(result))
    return ("event", result.id, result.source, result.type, result.time, result.seq,
            repr(result.data), repr(result.attributes))


@FUZZ
@given(lines(), st.integers(0, 5))
def test_the_envelope_reads_what_the_general_path_reads(line: bytes, seq: int) -> None:
    try:
        fast: Event | EventError | None = events._enveloped(line, seq)
    except EventError as exc:
        fast = exc
    if fast is not None:
        assert described(fast) == described(general(line, seq))
    assert [described(r) for r in read_lines([(seq, line)])] == [described(general(line, seq))]
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return
    assert [described(r) for r in read_texts([text])] == [described(general(text, 0))]


def test_the_common_line_takes_the_envelope() -> None:
    """The shape every benchmark and most producers write goes the short way, and its data is
    read when asked for, as it was written."""
    line = (b'{"specversion":"1.0","id":"e1","source":"urn:s","type":"t",'
            b'"time":"2026-03-02T10:00:00.5Z","data":{"area":"A","n":12345678901234567}}')
    event = events._enveloped(line, 3)
    assert event is not None and event == from_json_line(line, 3)
    assert event.data == {"area": "A", "n": 12345678901234567}
    assert event.attributes == {"specversion": "1.0"}


def test_what_the_envelope_leaves_to_the_general_path() -> None:
    base = '{"specversion":"1.0","id":"e1","source":"urn:s","type":"t","time":"%s"%s}'
    stamp = "2026-03-02T10:00:00Z"
    for line in [base % (stamp, ',"subject":"x"'),  # an extension attribute
                 base % (stamp, ',"data":"é"'),  # not ASCII
                 base % (stamp, ',"data":' + "[" * 120 + "]" * 120),  # many brackets
                 base % (stamp, ',"data":12345678901234567890123'),  # past 64 bits
                 base % (stamp, ',"data":NaN'),  # not JSON msgspec takes
                 base % (stamp, ',"data":1}')]:  # not JSON
        assert events._enveloped(line.encode(), 0) is None, line
    big = from_json_line(base % (stamp, ',"data":12345678901234567890123'))
    assert big.data == 12345678901234567890123


def test_an_invalid_time_is_the_general_paths_error() -> None:
    line = b'{"specversion":"1.0","id":"e1","source":"urn:s","type":"t","time":"2026-02-30T10:00:00Z"}'
    try:
        events._enveloped(line, 0)
    except EventError as exc:
        assert described(exc) == described(general(line, 0))
    else:
        raise AssertionError("an invalid date was read")
