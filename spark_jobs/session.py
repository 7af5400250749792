"""A SparkSession for the mediator's jobs: local mode by default, tuned for small machines.

Settings from research/spark.md §2: the UI off, two shuffle partitions (the default 200 would
mean 200 tasks and 200 state stores per stateful micro-batch), loopback addresses, RocksDB for
stateful streaming, UTC. Spark's Python workers run this interpreter, so they import the same
installed ``evamed`` package (the engine the driver uses).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def build_session(master: str = "local[2]", app: str = "evamed",
                  extra: dict[str, str] | None = None) -> Any:
    """Create (or reuse) a SparkSession. ``master`` may be a cluster URL; everything else the
    same code uses unchanged (``spark-submit --master …`` overrides it)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    local = os.path.join(tempfile.gettempdir(), "evamed-spark")
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
    return spark
