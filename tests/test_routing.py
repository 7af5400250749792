"""Which bucket of a profile's partitions an event goes to (spark_jobs/routing.py): the same in
every process and release (it names state in checkpoints), and one bucket per partition."""

from __future__ import annotations

import zlib
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from eva.events import Event, from_cloudevent
from eva.semantics import partition_key
from spark_jobs.routing import _bucket_of, bucket


def event(value: Any) -> Event:
    return from_cloudevent({"specversion": "1.0", "id": "e", "source": "s", "type": "t",
                            "time": "2026-01-01T00:00:00Z", "data": {"k": value}})


def test_buckets_are_pinned() -> None:
    # Checkpointed state is keyed by bucket: a change here strands every running job's state.
    assert [bucket(event(v), "data.k", 16) for v in ("T1", "T2", 7, 7.5, {"a": 1})] == [
        zlib.crc32(text.encode()) % 16
        for text in ('["str", "T1"]', '["str", "T2"]', '["int", 7]', '["float", 7.5]',
                     '"{\\"a\\":1}"')]
    assert bucket(event("T1"), None, 16) == 0
    assert bucket(event("T1"), "data.missing", 16) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=6)


@given(json_values, json_values, st.integers(1, 64))
def test_one_partition_one_bucket(a: Any, b: Any, buckets: int) -> None:
    """Values the engine files under one partition (equal keys: 0.0 and -0.0, objects with
    their keys in another order) share a bucket, asked in either order."""
    if a is None or b is None:
        return
    if partition_key(a) == partition_key(b):
        assert fresh_bucket(a, buckets) == fresh_bucket(b, buckets)
    assert fresh_bucket(b, buckets) == bucket(event(b), "data.k", buckets)


def fresh_bucket(value: Any, buckets: int) -> int | None:
    _bucket_of.cache_clear()  # a fresh worker: nothing asked before
    return bucket(event(value), "data.k", buckets)


def test_negative_zero_is_zero() -> None:
    assert partition_key(-0.0) == partition_key(0.0)
    assert fresh_bucket(-0.0, 1 << 20) == fresh_bucket(0.0, 1 << 20)
    assert fresh_bucket({"b": 1, "a": 2}, 1 << 20) == fresh_bucket({"a": 2, "b": 1}, 1 << 20)
