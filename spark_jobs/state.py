"""One key's engine in Spark's state store, by partition: what the processor
(spark_jobs/processor.py) takes before a call and stores after it.

Per (profile, bucket) key the state store holds ``core`` — the engine but its partitions
(``eva.snapshot.snapshot_core``: configuration, documents, clock, buffers, timers), with the
registration token and a stamp naming the state — and ``parts``, a map from partition id to
that partition's record. A call writes the core and only the partitions it changed
(``take_changed``: created, stepped, expired; a dropped one is removed), so its cost follows
what it touched, not how many partitions the bucket holds. A restore is lazy
(``restore_core``): a partition's record is read the first time the engine needs it.

Engines stay in the Python worker between calls (``_ENGINES``, by key, with the stamp of the
state they hold): a call whose key's engine is cached under the stamp the store holds uses it;
otherwise (another worker got the key, a restart, a retried batch) the engine is restored.
Restores are exact (tests/test_snapshot.py), so both are the same engine. All of it is data,
never code (docs/spark.md).
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from typing import Any

from eva import snapshot as snapshots
from eva.engine import Engine
from eva.snapshot import SnapshotError

FORMAT = f"partitions-{snapshots.FORMAT}"
"""The state format a checkpoint's layout records (spark_jobs/job.py ``check_layout``): the
store's layout (core and partition records) and the engine's record format."""

GroupKey = tuple[str, int]  # Spark's grouping key: (profile, bucket)


class CheckpointError(ValueError):
    """State in a checkpoint that this job did not write (or an older, pickle-based one):
    refused, never run."""


class _Records:
    """The key's partition records, read through the state of the call in progress: a cached
    engine restored lazily outlives the call that restored it, and Spark's state handle reads
    the state of the key being called."""

    def __init__(self, parts: Any) -> None:
        self.parts = parts

    def __call__(self, ident: str) -> bytes | None:
        found = self.parts.getValue((ident,))
        return None if found is None else bytes(found[0])


# Engines kept in the Python worker between micro-batches, by (profile, bucket): (stamp of the
# state they hold, engine, its record reader). Spark reuses its Python workers, so a key's
# engine is often still here (about half the calls on local[2], where a state partition goes
# to whichever worker is free). The processor class is shipped to the workers by value,
# globals and all, so it reaches the cache only through this module (shipped by reference).
_ENGINES: OrderedDict[GroupKey, tuple[str, Engine, _Records]] = OrderedDict()
_CACHED = 20_000


class KeyState:
    """One key's state through Spark's state handle (or a double of it, tests)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.core = handle.getValueState("core", "blob BINARY, token STRING, stamp STRING")
        self.parts = handle.getMapState("parts", "id STRING", "record BINARY")

    def take(self, key: GroupKey, token: str) -> tuple[Engine, _Records] | None:
        """The key's engine as the store holds it for registration ``token``, and its record
        reader; None if nothing is stored for it (a new key, or a profile registered again,
        whose old partitions go). Taken out of the cache: a call that fails half-way leaves
        no half-fed engine behind."""
        cached = _ENGINES.pop(key, None)
        if not self.core.exists():
            return None
        blob, stored, stamp = self.core.get()
        if stored != token:
            self.parts.clear()
            return None
        if cached is not None and cached[0] == stamp:
            cached[2].parts = self.parts
            return cached[1], cached[2]
        records = _Records(self.parts)
        try:
            engine = snapshots.restore_core(bytes(blob), records)
        except SnapshotError as exc:
            raise refused(key, exc) from None
        return engine, records

    def store(self, key: GroupKey, token: str, engine: Engine,
              records: _Records | None) -> None:
        """Write the call's changes — the partitions it changed, then the core — and cache
        the engine under the new state's stamp."""
        for ident, record in snapshots.take_changed(engine).items():
            if record is None:
                self.parts.removeKey((ident,))
            else:
                self.parts.updateValue((ident,), (record,))
        stamp = uuid.uuid4().hex
        self.core.update((snapshots.snapshot_core(engine), token, stamp))
        _ENGINES[key] = (stamp, engine, records or _Records(self.parts))
        while len(_ENGINES) > _CACHED:
            _ENGINES.popitem(last=False)

    def drop(self, key: GroupKey) -> None:
        """The profile left the table: its state, cached engine and timers go."""
        _ENGINES.pop(key, None)
        self.core.clear()
        self.parts.clear()
        self.clear_timers()

    def clear_timers(self) -> None:
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)


def refused(key: GroupKey, exc: BaseException) -> CheckpointError:
    return CheckpointError(f"checkpoint state of profile {key[0]} bucket {key[1]} refused: "
                           f"{exc}")
