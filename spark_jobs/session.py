"""A SparkSession for the mediator's jobs: local mode by default, tuned for small machines.

Settings from research/spark.md §2: the UI off, two shuffle partitions (the default 200 would
mean 200 tasks and 200 state stores per stateful micro-batch), loopback addresses in local
mode (a cluster's executors must reach the driver at the host's address), RocksDB for
stateful streaming, UTC. Spark's Python workers run this interpreter, so they import the same
installed ``evamed`` package (the engine the driver uses). Each session has a scratch directory
of its own (``spark.local.dir``: shuffle files, RocksDB working copies), removed at exit: jobs
on one machine do not share one. The JVM's standard output and error (the launcher's lines,
Spark's log, the local Python workers' start lines) go to a log file, not to the user's
terminal: the commands' own output and messages stay alone there.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import suppress
from typing import Any

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
JAVA_PACKAGE = "openjdk-17-jre-headless"


class SparkStartError(RuntimeError):
    """Spark cannot start here: no Java, or its JVM exited or gave up (a master URL it cannot
    parse, a master it cannot reach); the message says why in one line."""


def java_missing() -> str | None:
    """Why Spark cannot start on this machine, or None. Spark's launcher runs
    ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else ``java`` from PATH; without one PySpark
    fails with a long traceback about the Java gateway."""
    home = os.environ.get("JAVA_HOME")
    if home:
        if os.access(os.path.join(home, "bin", "java"), os.X_OK):
            return None
        return (f"JAVA_HOME is {home}, which has no bin/java; Spark needs Java 17 or later: "
                f"point JAVA_HOME at a Java installation or unset it (Debian: apt-get install "
                f"{JAVA_PACKAGE})")
    if shutil.which("java"):
        return None
    return (f"Spark needs Java 17 or later and found no java on PATH (JAVA_HOME is not set): "
            f"install one (Debian: apt-get install {JAVA_PACKAGE}) or set JAVA_HOME")


def _scratch() -> str:
    """A fresh scratch directory for one session, removed when this process exits."""
    path = tempfile.mkdtemp(prefix="evamed-spark-")
    # Registered before the session starts: atexit runs last-in first-out, so this runs after
    # PySpark's own shutdown.
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def build_session(master: str = "local[2]", app: str = "evamed",
                  extra: dict[str, str] | None = None, log: str | None = None) -> Any:
    """Create (or reuse) a SparkSession. ``master`` may be a cluster URL; everything else the
    same code uses unchanged. Under ``spark-submit`` what it was given (``--master``,
    ``--conf``) wins over ``master`` and these settings. ``log``: the file the JVM's output is
    appended to (default: ``spark.log`` in the session's scratch directory, removed at exit).
    SparkStartError if Spark cannot start (no Java: what to install)."""
    missing = java_missing()
    if missing is not None:
        raise SparkStartError(missing)
    given = _submitted()
    if given is not None:  # under spark-submit: its master and settings win
        master = given.get("spark.master", master)
    local_mode = master.startswith("local")
    if local_mode:  # a cluster's executors must reach the driver: Spark's choice of address
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    local = _scratch()
    log4j = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
    settings = {
        "spark.master": master,
        "spark.app.name": app,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.local.dir": local,
        "spark.sql.warehouse.dir": os.path.join(local, "warehouse"),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j}",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        **({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
           if local_mode else {}),
        **(extra or {}),
    }
    log = log or os.path.join(local, "spark.log")
    start = None  # where this process's JVM output begins in ``log``, if it started one now
    if given is None:
        start = _launch(settings, log)
    else:  # a builder's setting would replace --master or a raised shuffle partition count
        settings = {key: value for key, value in settings.items() if not given.contains(key)}
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # py4j's error says little ("a stopped SparkContext"); the log why
        why = _reason(log, start) if start is not None else str(exc).strip().splitlines()[0]
        raise SparkStartError(f"Spark did not start (master {master}): {why}") from exc
    spark.sparkContext.setLogLevel("ERROR")
    # Stopped at exit before the scratch directory goes (last in, first out): a running JVM
    # would still be writing into it.
    atexit.register(_stop, spark)
    return spark


def _submitted() -> Any:
    """spark-submit's configuration when this process runs under it (its JVM is up and named
    by ``PYSPARK_GATEWAY_PORT``): a SparkConf of what it was given (``--master``, ``--conf``,
    its defaults file), else None."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM
    return SparkConf()  # loadDefaults: the JVM's spark.* properties


def _launch(settings: dict[str, str], log: str) -> int | None:
    """Start the driver's JVM as PySpark would, with its standard output and error appended
    to ``log``. PySpark (pinned: 4.3) leaves them on the terminal, where the launcher writes
    "Using incubator modules", Spark its log, and the local Python workers (their output is
    copied to the JVM's) their start lines. A JVM this process started before (PySpark keeps
    it) is reused, with its log: None. Else where the new JVM's output begins in ``log``.
    SparkStartError with the JVM's reason if it exits at start (a master URL it cannot parse):
    PySpark's own error says only that it exited."""
    from pyspark import SparkConf, SparkContext
    from pyspark.errors import PySparkRuntimeError
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return None
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    with open(log, "ab") as out:  # the JVM keeps a descriptor of its own
        start = out.tell()
        try:
            gateway = launch_gateway(  # type: ignore[no-untyped-call]  # PySpark's is untyped
                conf, popen_kwargs={"stdout": out, "stderr": subprocess.STDOUT})
        except PySparkRuntimeError as exc:  # JAVA_GATEWAY_EXITED
            raise SparkStartError(f"Spark did not start: {_reason(log, start)}") from exc
    SparkContext._ensure_initialized(gateway=gateway)
    return start


def _reason(log: str, start: int) -> str:
    """Why the JVM failed, from what it wrote to ``log`` after ``start``: the first line naming
    an exception (``Exception in thread "main" …: message``), an error (``Error: …``, an
    ERROR log line: "All masters are unresponsive"), else its last line."""
    with open(log, "rb") as written:
        written.seek(start)
        lines = [line.strip() for line in written.read().decode("utf-8", "replace").splitlines()
                 if line.strip() and not line[:1].isspace()]  # not a stack frame
    named = [line for line in lines
             if "Exception" in line or line.startswith("Error") or " ERROR " in line]
    found = (named or lines or ["it wrote nothing"])[0 if named else -1]
    # Without the log layout's time and level, or the launcher's thread name
    return re.sub(r'^(\d\d:\d\d:\d\d ERROR \S+: |Exception in thread "main" )', "", found)


def _stop(spark: Any) -> None:
    with suppress(Exception):  # already stopped, or its JVM is gone: nothing to clean
        spark.stop()
