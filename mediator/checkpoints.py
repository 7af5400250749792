"""Checkpoints: what the pipeline needs to resume without replaying its history.

A restarted mediator used to rebuild every runner by replaying the logs from each
subscription's start — linear in history. A checkpoint holds, at one moment between rounds,
where each input was read to (the event log's position, each link log's), the inputs'
progress, the merged trace's origin, every checkpointed subscription's federations' state (the
runners: mediator.pipeline, transforms/runner.py export_state) and the provenance index. A
restart takes up the newest checkpoint it can read and reads the logs after it.

What cannot be checkpointed replays from its start, as before: a subscription with a query at
a **fed** service (the service's native state is the service's, started afresh when the
mediator subscribes again), and one the Spark composer composes (its jobs keep their own
checkpoints; the pipeline's part of it is rebuilt from the logs). The logs are trimmed below
what the oldest kept checkpoint and those subscriptions still need, so storage is bounded by
the checkpoint interval and the subscriptions' reach, not by history.

The format is data only — a version line, then zlib-compressed JSON written by
:func:`eva.snapshot.to_data` (an allow-list of value classes; nothing it names is run) — and a
checkpoint of another format, or one that does not read, is refused by name: the pipeline
falls back to the previous one, or to a replay of what the logs hold, saying so.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from eva.snapshot import MAX_STATE_BYTES, SnapshotError, from_data, inflate, to_data

FORMAT = 1
"""The checkpoint format; a checkpoint of another is refused (its state may mean something
else)."""
MAGIC = b"evamed-pipeline-checkpoint "


class CheckpointError(ValueError):
    """A checkpoint that cannot be taken up: what it is, and what was expected."""


def write(state: dict[str, Any]) -> bytes:
    """A checkpoint of ``state`` (the pipeline's: see :meth:`Pipeline._checkpoint`)."""
    # json, not orjson: what an event's data holds (a NaN, an integer past 64 bits) is
    # written as json would read it back, as engine snapshots do.
    text = json.dumps(to_data(state), separators=(",", ":")).encode()
    if len(text) > MAX_STATE_BYTES:
        raise CheckpointError(f"the pipeline's state is {len(text):,} bytes of JSON, over the "
                              f"{MAX_STATE_BYTES:,} a checkpoint may hold")
    return MAGIC + str(FORMAT).encode() + b"\n" + zlib.compress(text, 1)


def read(data: bytes) -> dict[str, Any]:
    """The state a checkpoint holds; CheckpointError naming what is wrong with it."""
    head, newline, body = data.partition(b"\n")
    if not newline or not head.startswith(MAGIC):
        raise CheckpointError(f"not an evamed pipeline checkpoint (it starts with "
                              f"{data[:24]!r})")
    version = head[len(MAGIC):].decode("ascii", "replace")
    if version != str(FORMAT):
        raise CheckpointError(f"a checkpoint of format {version}; this evamed reads format "
                              f"{FORMAT}")
    try:
        state = from_data(json.loads(inflate(body)), "checkpoint")
    except (SnapshotError, zlib.error, ValueError, RecursionError) as exc:
        raise CheckpointError(f"a malformed checkpoint: {exc}") from None
    if type(state) is not dict or not {"own", "feeds", "subs"} <= set(state):
        raise CheckpointError("a checkpoint without its parts (own, feeds, subs)")
    return state


def positions(state: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint holds the logs to: its event-log position, each link log's, and the
    subscriptions it holds (the logs are trimmed below the oldest kept one's)."""
    own = state["own"]
    return {"own": min(own["held"]) - 1 if own.get("held") else own["position"],
            "feeds": {name: feed["position"] for name, feed in state["feeds"].items()},
            "subs": set(state["subs"])}


__all__ = ["FORMAT", "CheckpointError", "positions", "read", "write"]
