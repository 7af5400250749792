"""Composite events as JSON: the direct writer is json.dumps of the CloudEvent, to the byte."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from eva import notify
from eva.engine import Engine
from eva.events import Event
from eva.notify import composite_id, composite_line, composite_lines, to_cloudevent
from eva.parser import parse
from eva.semantics import Notification, Occ

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(), lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(), inner, max_size=3), max_leaves=6)


@given(st.text(min_size=1), _JSON, st.lists(st.text(min_size=1), min_size=1, max_size=4),
       st.integers(0, 4_102_444_800_000_000))
def test_composite_line_is_json_dumps_of_the_cloudevent(profile: str, partition: Any,
                                                        events: list[str], time: int) -> None:
    occ = Occ(time, (time, 0, 0), tuple(events), tuple(events))
    note = Notification(profile, partition, occ, (time, 0, 0))
    ident, line = composite_line(note)
    assert line == json.dumps(to_cloudevent(note)) and ident == composite_id(note)


def _reference_line(note: Notification) -> str:
    """The composite's CloudEvent as it was written before the direct writers: the id the
    digest of ``repr((profile, partition, ident))``, the line ``json.dumps`` of the dict."""
    ident = hashlib.blake2b(repr((note.profile, note.partition, note.occ.ident)).encode(),
                            digest_size=12).hexdigest()
    body = to_cloudevent(note)
    body["id"] = ident
    return json.dumps(body)


_TEXT = st.text(st.sampled_from(["a", "é", "'", '"', "\\", "\n", "7", "\u2028"]), min_size=1,
                max_size=4)
_IDENT = st.recursive(_TEXT | st.integers(-5, 5) | st.booleans() | st.none(),
                      lambda inner: st.tuples(inner) | st.tuples(inner, inner)
                      | st.tuples(_TEXT, inner, inner) | st.tuples(inner, inner, inner, inner),
                      max_leaves=8)


@given(_IDENT)
def test_identity_text_is_repr(ident: Any) -> None:
    """A composite's id digests this text: it must stay ``repr``, character for character."""
    assert notify._repr(ident) == repr(ident)


_DOCUMENT = """
class A = type == "A"
class B = type == "B"
class C = type == "C"
profile Pairs = ((all_dup(A); all_dup(B))_3s)_all_pairs
profile Per per data.key = ((last_dup(A), all_dup(C))_2s)_unique_pairs
profile Nested = ((all_dup(((all_dup(A); all_dup(B))_2s)_all_pairs); all_dup(C))_3s)_all_pairs
profile Either = (all_dup(B) | all_dup(C))_all_pairs
profile Quiet = ((all_dup(A); all_dup(((not C)_2s)_all_pairs))_2s)_all_pairs
"""

_EVENTS = st.lists(st.tuples(st.sampled_from("ABC"), _TEXT, st.sampled_from(["s", "s'2", "é"]),
                             st.integers(0, 2), st.sampled_from(["k", 1, True, None, 2.5])),
                   max_size=40)


@settings(max_examples=60, deadline=None)
@given(_EVENTS)
def test_composite_lines_are_the_reference_cloudevents_over_random_traces(
        trace: list[tuple[str, str, str, int, Any]]) -> None:
    """The batched writer (`evamed replay`'s output) and the single one (the pipeline's)
    write, for the composites of random traces over every operator, ``per`` values of each
    JSON kind and identities with text that needs escapes, the reference's bytes and ids."""
    engine = Engine()
    engine.add_document(parse(_DOCUMENT))
    notes: list[Notification] = []
    t = 0
    for i, (kind, ident, source, gap, key) in enumerate(trace):
        t += gap * 1_000_000
        notes += engine.push(Event(f"{ident}{i}", source, kind, t, i, {"key": key}))
    notes += engine.close()
    counts: dict[str, int] = {}
    assert composite_lines(notes, counts) == "".join(_reference_line(n) + "\n" for n in notes)
    assert counts == dict(Counter(n.profile for n in notes))
    for n in notes:
        ident, line = composite_line(n)
        assert line == _reference_line(n) and ident == json.loads(line)["id"]
