"""Composite events as JSON: the direct writer is json.dumps of the CloudEvent, to the byte."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from eva.notify import composite_id, composite_line, to_cloudevent
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
