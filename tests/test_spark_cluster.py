"""The Spark jobs on a real cluster (issue 15, item 4): a standalone master and two workers
(1 core, 1 GiB each) started from the PySpark installation on loopback ports, and `evamed
compose --master spark://…`, `evamed replay --engine spark --master spark://…` and a
spark-submit of examples/spark_driver.py run as real processes against it: their output is
what the in-process `evamed replay` prints. Also (item 6): Spark's launcher and log lines stay
off the commands' standard error. Every Spark run here is a subprocess: PySpark keeps one JVM
per process, so a session in the test process would be test_spark.py's local one."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from eva.events import format_time, parse_time
from spark_jobs.spool import spool_file

pytestmark = pytest.mark.xdist_group("spark")

EVAMED = str(Path(sys.executable).parent / "evamed")
LOGISTICS = "examples/logistics/profiles.eva"
# Lines of Spark's, its launcher's or its Python workers' (not evamed's own messages).
SPARK_LINE = re.compile(r"WARN|INFO|ERROR|log4j|[Ss]park|incubator|NativeCodeLoader|[Ii]vy|"
                        r"py4j|Stage \d|daemon|worker")
# Every operator over `per` partitions (sequence, conjunction, disjunction, selection,
# negation on the clock) and a profile without `per` over a time class.
PER_PROFILES = """\
class A = type == "a"
class B = type == "b"
class C = type == "c"
class AB = type in ["a", "b"]
class Tick = every 5s
profile S per data.k = ((first_dup(A); all_dup(B))_5s)_unique_pairs
profile J per data.k = ((all_dup(AB), last_dup(C))_3s)_all_pairs
profile D per data.k = (first_dup(A) | 2_dup(C))_repeated_pairs
profile N per data.k = ((last_dup(A); all_dup(((not B)_2s)_all_pairs))_4s)_all_pairs
profile X per data.k = (C[2])_unique_pairs
profile W = ((last_dup(C); first_dup(Tick))_5s)_all_pairs
"""


@dataclass(frozen=True)
class Cluster:
    url: str  # spark://127.0.0.1:PORT
    ui: int  # the master's web UI port (its state as JSON at /json/)
    home: Path  # SPARK_HOME: the PySpark installation
    env: dict[str, str]  # for the driver processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _master_state(ui: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as response:
        state: dict[str, Any] = json.load(response)
    return state


def _daemon(home: Path, log: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """A Spark daemon in a process group of its own (spark-class execs the JVM; a worker's
    executors and their Python workers are its children), its output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen([str(home / "bin" / "spark-class"), *args], env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=15)
            break
        except subprocess.TimeoutExpired:
            continue
    process.wait()


def _wait_for_workers(cluster: Cluster, daemons: dict[Path, subprocess.Popen[bytes]],
                      count: int) -> None:
    deadline = time.monotonic() + 120
    while True:
        for log, daemon in daemons.items():
            assert daemon.poll() is None, f"{log.name} exited: {log.read_text()[-2000:]}"
        try:
            alive = [w for w in _master_state(cluster.ui)["workers"] if w["state"] == "ALIVE"]
        except (OSError, ValueError):  # the master's UI is not up yet, or answered an empty
            alive = []                      # body while it starts (seen once under load)
        if len(alive) >= count:
            return
        assert time.monotonic() < deadline, "the workers did not register with the master"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A standalone master and two workers (1 core, 1 GiB each) on loopback ports; their logs
    and work directories under a temporary directory; stopped also when a test fails."""
    from pyspark.find_spark_home import _find_spark_home

    base = tmp_path_factory.mktemp("cluster")
    home = Path(_find_spark_home())
    port, ui = _free_port(), _free_port()
    # The executors run this interpreter, so they import the same evamed package — from the
    # same tree when PYTHONPATH names one (a source copy run in place, PYTHONPATH=.), made
    # absolute since they run in work directories of their own.
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve())
                                            for p in env["PYTHONPATH"].split(os.pathsep))
    cluster = Cluster(f"spark://127.0.0.1:{port}", ui, home, env)
    daemons: dict[Path, subprocess.Popen[bytes]] = {}
    try:
        log = base / "master.log"
        daemons[log] = _daemon(home, log, env, "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(port),
                               "--webui-port", str(ui))
        for i in range(2):
            log = base / f"worker-{i}.log"
            daemons[log] = _daemon(home, log, env, "org.apache.spark.deploy.worker.Worker",
                                   cluster.url, "--cores", "1", "--memory", "1g",
                                   "--host", "127.0.0.1", "--webui-port", str(_free_port()),
                                   "--work-dir", str(base / f"work-{i}"))
        _wait_for_workers(cluster, daemons, 2)
        yield cluster
    finally:
        for daemon in reversed(daemons.values()):
            _stop(daemon)


def _run(command: list[str], env: dict[str, str] | None = None, quiet: bool = True) -> str:
    """Run a command to its end; its standard output. It must succeed and, if ``quiet``, its
    standard error carry no line of Spark's."""
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    spark_lines = [line for line in done.stderr.splitlines() if SPARK_LINE.search(line)]
    assert not quiet or spark_lines == [], spark_lines[:10]
    return done.stdout


def _replay(profiles: str, events: Path, *options: str, env: dict[str, str] | None = None,
            ) -> list[str]:
    return _run([EVAMED, "replay", "--profiles", profiles, "--events", str(events), *options],
                env).splitlines()


def _compose(profiles: str, spool: Path, work: Path, *options: str,
             env: dict[str, str] | None = None) -> list[str]:
    """The composites `evamed compose --once` writes for the spool."""
    out, checkpoint = work / "out", work / "checkpoint"
    _run([EVAMED, "compose", "--once", "--profiles", profiles, "--spool", str(spool),
          "--out", str(out), "--checkpoint", str(checkpoint), *options], env)
    assert (checkpoint / "spark.log").is_file()  # the JVM's output went there
    return [line for f in sorted(out.glob("composites-*.jsonl"))
            for line in f.read_text().splitlines() if line]


def _same_composites(got: list[str], want: list[str]) -> None:
    """The same composites, as JSON, in any order (the job writes a file per micro-batch)."""
    def canonical(lines: list[str]) -> list[str]:
        return sorted(json.dumps(json.loads(line), sort_keys=True) for line in lines)

    assert canonical(got) == canonical(want)


def _apps(cluster: Cluster) -> list[str]:
    """The names of the applications that ran on the cluster."""
    return [app["name"] for app in _master_state(cluster.ui)["completedapps"]]


def _per_trace(seed: int = 15, size: int = 240) -> list[dict[str, Any]]:
    """A random trace over 12 `per` keys (numbers and strings, some events without one) from
    two sources, many at equal times, and a last event no profile wants 60 s later (the
    streaming job decides an instant once a later event moves its watermark)."""
    rng = random.Random(seed)
    t = parse_time("2026-03-04T08:00:00Z")
    keys: list[Any] = [1, 2, 3, "3", 4, 5.5, "x", 7, 8, 9, 10, 11]
    events: list[dict[str, Any]] = []
    for i in range(size):
        t += rng.choice([0, 0, 1, 1, 2, 3, 6]) * 1_000_000
        kind = rng.choice("abc")
        data = {} if rng.random() < 0.05 else {"k": rng.choice(keys)}
        events.append({"specversion": "1.0", "id": f"{kind}{i}", "source": rng.choice("st"),
                       "type": kind, "time": format_time(t), "data": data})
    events.append({"specversion": "1.0", "id": "end", "source": "s", "type": "none",
                   "time": format_time(t + 60_000_000)})
    return events


def test_demo_day_on_the_cluster_is_what_replay_prints(cluster: Cluster, tmp_path: Path) -> None:
    """The logistics day as `make demo` makes it: `evamed compose --master spark://…` writes
    the composites `evamed replay` prints, and `replay --engine spark --master spark://…`
    prints them byte for byte, in order — both run on the cluster's executors."""
    spool = tmp_path / "spool"
    spool.mkdir()
    day = spool / "day.jsonl"
    subprocess.run([sys.executable, "examples/logistics/generate.py", "--out", str(day)],
                   check=True, capture_output=True)
    want = _replay(LOGISTICS, day)
    assert len(want) > 50
    _same_composites(_compose(LOGISTICS, spool, tmp_path, "--master", cluster.url,
                              env=cluster.env), want)
    assert _replay(LOGISTICS, day, "--engine", "spark", "--master", cluster.url,
                   env=cluster.env) == want
    assert _apps(cluster).count("evamed-compose") == 1 and "evamed" in _apps(cluster)


def test_per_keys_on_the_cluster_and_through_spark_submit(cluster: Cluster,
                                                          tmp_path: Path) -> None:
    """A random trace with `per` keys, spooled as two files taken one per micro-batch (so
    state moves between micro-batches and executors; four buckets, to keep the run short):
    `evamed compose --master spark://…` writes what `evamed replay` prints. The same code
    submitted with spark-submit (examples/spark_driver.py running `replay --engine spark`)
    prints it byte for byte, on spark-submit's master and under its application name — its
    settings win over the session's defaults."""
    profiles = tmp_path / "per.eva"
    profiles.write_text(PER_PROFILES)
    events = [json.dumps(e) for e in _per_trace()]
    spool = tmp_path / "spool"
    spool.mkdir()
    half = len(events) // 2
    for k, part in enumerate((events[:half], events[half:])):
        spool_file(str(spool), f"part-{k}.jsonl", part, time.time() - 100 + k)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(events) + "\n")
    want = _replay(str(profiles), trace)
    assert {json.loads(line)["subject"] for line in want} >= {"S", "J", "D", "N", "X", "W"}
    _same_composites(_compose(str(profiles), spool, tmp_path, "--master", cluster.url,
                              "--max-files", "1", "--buckets", "4", env=cluster.env), want)
    submitted = _run([str(cluster.home / "bin" / "spark-submit"), "--master", cluster.url,
                      "--conf", "spark.sql.shuffle.partitions=3", "examples/spark_driver.py",
                      "replay", "--engine", "spark", "--profiles", str(profiles),
                      "--events", str(trace)], cluster.env, quiet=False)  # spark-submit's
    assert submitted.splitlines() == want
    assert "spark_driver.py" in _apps(cluster)


def test_spark_lines_stay_off_standard_error_in_local_mode(tmp_path: Path) -> None:
    """`evamed replay --engine spark` in local mode (the default; its Python workers are the
    driver JVM's children): standard error has none of the lines Spark's launcher, its log or
    its Python workers wrote there ("Using incubator modules", "Setting default log level",
    WARN lines). `compose` and `replay --engine spark` on the cluster are checked alike above
    (`_run`), and compose's JVM log is spark.log in its checkpoint."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(e) for e in _per_trace(seed=6, size=40)) + "\n")
    profiles = tmp_path / "per.eva"
    profiles.write_text(PER_PROFILES)
    want = _replay(str(profiles), trace)
    assert want and _replay(str(profiles), trace, "--engine", "spark") == want


@pytest.mark.parametrize("command", ["compose", "replay"])
def test_a_master_spark_cannot_use_is_one_line_naming_why(tmp_path: Path, command: str) -> None:
    """`--master foo`: Spark's launcher exits at once, its reason in the JVM's log only (PySpark
    says "Java gateway process exited"); the command exits 2 with Spark's reason in one line."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps(_per_trace(size=3)[0]) + "\n")
    args = {"compose": ["--spool", str(tmp_path), "--out", str(tmp_path / "out"),
                        "--checkpoint", str(tmp_path / "ckpt")],
            "replay": ["--engine", "spark", "--events", str(trace)]}[command]
    done = subprocess.run([EVAMED, command, "--profiles", LOGISTICS, "--master", "foo", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("error: Spark did not start: org.apache.spark.SparkException: Master "
                           "must either be yarn or start with spark, k8s, or local\n")
