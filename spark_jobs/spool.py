"""The job's input, the spool: a directory of CloudEvents JSON-lines files that the streaming
job reads in modification order, each file appearing whole (the other input is the Redis log,
spark_jobs/redis_io.py). Every other file the job shares with its readers — the profile table,
the checkpoint's layout record, the directory sink's batch files — is written whole the same
way (``write_whole``)."""

from __future__ import annotations

import os
from typing import Any


def write_whole(path: str, text: str, mtime: float | None = None) -> None:
    """Readers see the old file or the new one, never part of one: written under a hidden name
    beside it (the file source skips names starting with a dot) and renamed; ``mtime`` set
    before the rename, so the file has it from the moment it can be seen."""
    folder, name = os.path.split(path)
    hidden = os.path.join(folder, f".{name}.tmp")
    with open(hidden, "w", encoding="utf-8") as handle:
        handle.write(text)
    if mtime is not None:
        os.utime(hidden, (mtime, mtime))
    os.replace(hidden, path)


def spool_file(spool: str, name: str, lines: list[str], stamp: float) -> str:
    """Drop a file of lines into the spool, whole and with modification time ``stamp`` (its
    place in the arrival order)."""
    path = os.path.join(spool, name)
    write_whole(path, "\n".join(lines) + "\n", stamp)
    return path


def spool_lines(spark: Any, spool: str, max_files: int | None = None) -> Any:
    """A spool directory of CloudEvents JSON-lines files as a stream of (value, seq) lines.
    Arrival order (seq): files in modification order (the order the file source takes them),
    then line position; blank lines skipped."""
    import pyspark.sql.functions as F

    # Each file is one row and its lines are numbered in the JVM: the numbering holds however
    # the lines are later split up (by source, over the cores).
    reader = spark.readStream.format("text").option("wholetext", True)
    if max_files:
        reader = reader.option("maxFilesPerTrigger", max_files)
    lines = reader.load(spool).select(
        F.posexplode(F.split("value", "\n")).alias("pos", "value"),
        F.expr("unix_millis(_metadata.file_modification_time)").alias("millis"))
    return lines.where(F.trim("value") != "").select(
        "value", (F.col("millis") * 1_000_000 + F.col("pos")).alias("seq"))
