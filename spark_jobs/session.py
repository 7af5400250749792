"""A SparkSession for the mediator's jobs: local mode by default, tuned for small machines.

Settings from research/spark.md §2: the UI off, two shuffle partitions (the default 200 would
mean 200 tasks and 200 state stores per stateful micro-batch), loopback addresses, RocksDB for
stateful streaming, UTC. Spark's Python workers run this interpreter, so they import the same
installed ``evamed`` package (the engine the driver uses). Each session has a scratch directory
of its own (``spark.local.dir``: shuffle files, RocksDB working copies), removed at exit: jobs
on one machine do not share one.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from contextlib import suppress
from typing import Any

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
JAVA_PACKAGE = "openjdk-17-jre-headless"


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
                  extra: dict[str, str] | None = None) -> Any:
    """Create (or reuse) a SparkSession. ``master`` may be a cluster URL; everything else the
    same code uses unchanged (``spark-submit --master …`` overrides it). RuntimeError (with
    what to install) if there is no Java."""
    missing = java_missing()
    if missing is not None:
        raise RuntimeError(missing)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    local = _scratch()
    log4j = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.local.dir", local)
               .config("spark.sql.warehouse.dir", os.path.join(local, "warehouse"))
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
               .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB))
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # Stopped at exit before the scratch directory goes (last in, first out): a running JVM
    # would still be writing into it.
    atexit.register(_stop, spark)
    return spark


def _stop(spark: Any) -> None:
    with suppress(Exception):  # already stopped, or its JVM is gone: nothing to clean
        spark.stop()
