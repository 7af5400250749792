"""Where the streaming job's output goes, at the end of the data flow: each micro-batch's
(kind, profile, ident, payload) rows, handed over by ``foreachBatch`` with the batch id. A
directory here; Redis in spark_jobs/redis_io.py (``redis_sink``); any callback of the same
shape (the SparkComposer's)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from spark_jobs.spool import write_whole

Sink = Callable[[int, list[Any]], None]
"""``sink(batch_id, rows)``: rows with attributes kind, profile, ident, payload."""


def directory_sink(out_dir: str) -> Sink:
    """Composites and dead letters to ``out_dir`` as one file per batch id, written atomically:
    a batch re-run after a restart replaces its own file (idempotent)."""
    os.makedirs(out_dir, exist_ok=True)

    def write(batch_id: int, rows: list[Any]) -> None:
        for kind in ("composite", "dead_letter"):
            chosen = sorted(r.payload for r in rows if r.kind == kind)
            if not chosen:
                continue
            write_whole(os.path.join(out_dir, f"{kind}s-{batch_id:08d}.jsonl"),
                        "\n".join(chosen) + "\n")

    return write
