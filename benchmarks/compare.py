"""Side by side with Flink CEP and OpenCEP (issue 27.4): `evamed replay` end to end against the
two anchors on the same file of CloudEvents JSON lines, one core each, interleaved rounds,
match counts checked equal. Fetches the anchors only when asked (``--fetch``) and never runs in
`make test`; it says clearly what it could not fetch or run, and compares what it has.

The trace is ``benchmarks/replay.py``'s (types A/B/C uniform, one per second). The workloads:

* **followedByAny** (all pairs): Flink ``begin(A).followedByAny(B).within(5 s)``, OpenCEP
  ``SEQ(A, B)`` within 4 s (its default: any match), EVA ``((all_dup(A); all_dup(B))_4s)_all_pairs``;
* **followedBy** (each A with the first B after it): Flink ``begin(A).followedBy(B).within(5 s)``,
  EVA ``((all_dup(A); first_dup(B))_4s)_unique_pairs`` (OpenCEP's default is any match: not run).

Flink's ``within(W)`` excludes a pair exactly W apart, EVA's frame ``(t(a), t(a) + W]``
includes it: on one event a second EVA's 4 s frame is Flink's 5 s window (the counts say so).
OpenCEP's ``within`` includes its edge too (given 5 s it counted 555,836 matches where the others
count 444,801), so it is given 4 s.
Every system reads the JSON lines itself: evamed as a user runs it (``python -m mediator
replay``, output to a file), Flink through a ``FileSource`` and Jackson (its job time, JVM and
mini-cluster start excluded — which favours Flink), OpenCEP through a ``DataFormatter`` that
parses each line with ``json``. The parse floor (orjson per line) is given too.

Anchors (``--cache``, default ``~/.cache/evamed-compare``):
* Flink CEP: ``pip download --no-deps --no-binary :all: apache-flink-libraries==2.3.0`` (its
  sdist carries the Flink jars: flink-dist, flink-cep, flink-connector-files), compiled against
  with ``javac`` (Java 17);
* OpenCEP: ``git clone --depth 1 https://github.com/ilya-kolchinsky/OpenCEP``.

    .venv/bin/python benchmarks/compare.py --fetch [--events 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere
from benchmarks.replay import FLOOR, write_events

FLINK_VERSION = "2.3.0"
OPENCEP = "https://github.com/ilya-kolchinsky/OpenCEP"
CLASSES = 'class A = type == "A"\nclass B = type == "B"\n'
WORKLOADS = {
    "followedByAny (all pairs)": ("any", "((all_dup(A); all_dup(B))_4s)_all_pairs"),
    "followedBy (each A with its first B)": (
        "next", "((all_dup(A); first_dup(B))_4s)_unique_pairs"),
}

FLINK_JOB = r"""
import java.time.Duration;
import java.time.Instant;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.cep.CEP;
import org.apache.flink.cep.functions.PatternProcessFunction;
import org.apache.flink.cep.pattern.Pattern;
import org.apache.flink.cep.pattern.conditions.SimpleCondition;
import org.apache.flink.connector.file.src.FileSource;
import org.apache.flink.connector.file.src.reader.TextLineInputFormat;
import org.apache.flink.core.fs.Path;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

/** SEQ(A, B) within W seconds over CloudEvents JSON lines, one task: prints matches and the
 *  job's seconds. */
public class FlinkCepBench {
    public static class Ev {
        public String id;
        public String type;
        public long time;
        public Ev() {}
    }

    static final AtomicLong MATCHES = new AtomicLong();

    public static class Parse implements MapFunction<String, Ev> {
        private transient ObjectMapper mapper;

        @Override
        public Ev map(String line) throws Exception {
            if (mapper == null) mapper = new ObjectMapper();
            JsonNode node = mapper.readTree(line);
            Ev e = new Ev();
            e.id = node.get("id").asText();
            e.type = node.get("type").asText();
            e.time = Instant.parse(node.get("time").asText()).toEpochMilli();
            return e;
        }
    }

    public static class Count extends PatternProcessFunction<Ev, Long> {
        @Override
        public void processMatch(Map<String, List<Ev>> match, Context ctx, Collector<Long> out) {
            MATCHES.incrementAndGet();
        }
    }

    public static void main(String[] args) throws Exception {
        String file = args[0];
        boolean any = args[1].equals("any");
        long window = Long.parseLong(args[2]);
        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(1);
        FileSource<String> source = FileSource.forRecordStreamFormat(
            new TextLineInputFormat(), new Path(file)).build();
        DataStream<Ev> events = env.fromSource(source, WatermarkStrategy.noWatermarks(), "events")
            .map(new Parse())
            .assignTimestampsAndWatermarks(WatermarkStrategy.<Ev>forMonotonousTimestamps()
                .withTimestampAssigner((e, ts) -> e.time));
        Pattern<Ev, Ev> first = Pattern.<Ev>begin("a")
            .where(SimpleCondition.of(e -> e.type.equals("A")));
        Pattern<Ev, Ev> pattern = (any ? first.followedByAny("b") : first.followedBy("b"))
            .where(SimpleCondition.of(e -> e.type.equals("B")))
            .within(Duration.ofSeconds(window));
        CEP.pattern(events, pattern).process(new Count()).sinkTo(new DiscardingSink<>());
        long t0 = System.nanoTime();
        env.execute("cep");
        long t1 = System.nanoTime();
        System.out.println(MATCHES.get() + " " + (t1 - t0) / 1e9);
    }
}
"""

OPENCEP_DRIVER = r"""
import collections, collections.abc, json, sys, time
collections.Callable = collections.abc.Callable  # OpenCEP imports it from where Python < 3.10 had it
from datetime import datetime, timedelta
from CEP import CEP
from base.DataFormatter import DataFormatter, EventTypeClassifier
from base.Pattern import Pattern
from base.PatternStructure import PrimitiveEventStructure, SeqOperator
from condition.CompositeCondition import AndCondition
from stream.Stream import InputStream, OutputStream


class Types(EventTypeClassifier):
    def get_event_type(self, payload):
        return payload["type"]


class Lines(DataFormatter):
    def __init__(self):
        super().__init__(Types())

    def parse_event(self, raw):
        return json.loads(raw)

    def get_event_timestamp(self, payload):
        return datetime.strptime(payload["time"], "%Y-%m-%dT%H:%M:%SZ")


class Events(InputStream):
    def __init__(self, path):
        super().__init__()
        with open(path) as f:
            for line in f:
                self._stream.put(line)
        self.close()


class Count(OutputStream):
    def __init__(self):
        super().__init__()
        self.n = 0

    def add_item(self, item):
        self.n += 1


pattern = Pattern(SeqOperator(PrimitiveEventStructure("A", "a"), PrimitiveEventStructure("B", "b")),
                  AndCondition(), timedelta(seconds=int(sys.argv[2])))
events, matches = Events(sys.argv[1]), Count()
t0 = time.perf_counter()
CEP([pattern]).run(events, matches, Lines())
print(matches.n, time.perf_counter() - t0)
"""


def fetch(cache: Path) -> None:
    """The anchors into ``cache``; what could not be fetched is said, not fatal."""
    cache.mkdir(parents=True, exist_ok=True)
    if not flink_jars(cache):
        print(f"fetching apache-flink-libraries=={FLINK_VERSION} from PyPI …", flush=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                               "--no-binary", ":all:", f"apache-flink-libraries=={FLINK_VERSION}",
                               "-d", str(cache)], capture_output=True, text=True)
        archives = list(cache.glob(f"apache_flink_libraries-{FLINK_VERSION}.tar.gz"))
        if done.returncode or not archives:
            print(f"could NOT fetch apache-flink-libraries: {done.stderr.strip()[-400:]}")
        else:
            with tarfile.open(archives[0]) as tar:
                wanted = [m for m in tar.getmembers()
                          if "/deps/lib/" in m.name and m.name.endswith(".jar")]
                tar.extractall(cache, members=wanted, filter="data")
    if not (cache / "OpenCEP" / "CEP.py").exists():
        print(f"cloning {OPENCEP} …", flush=True)
        done = subprocess.run(["git", "clone", "--depth", "1", OPENCEP, str(cache / "OpenCEP")],
                              capture_output=True, text=True)
        if done.returncode:
            print(f"could NOT clone OpenCEP: {done.stderr.strip()[-300:]}")


def flink_jars(cache: Path) -> list[Path]:
    return sorted(cache.glob(f"apache_flink_libraries-{FLINK_VERSION}/deps/lib/*.jar"))


def flink_ready(cache: Path) -> str | None:
    """The classpath of the compiled Flink job, or None (and why) when it cannot run."""
    jars = flink_jars(cache)
    if not jars:
        print("Flink CEP: not fetched (run with --fetch): skipped")
        return None
    if shutil.which("javac") is None:
        print("Flink CEP: no javac (Java 17 JDK) on PATH: skipped")
        return None
    classes = cache / "flink-job"
    classes.mkdir(exist_ok=True)
    source = classes / "FlinkCepBench.java"
    if not (classes / "FlinkCepBench.class").exists() or source.read_text() != FLINK_JOB:
        source.write_text(FLINK_JOB)
        path = os.pathsep.join(str(j) for j in jars)
        done = subprocess.run(["javac", "-cp", path, "-d", str(classes), str(source)],
                              capture_output=True, text=True)
        if done.returncode:
            print(f"Flink CEP: the job did not compile: skipped\n{done.stderr[-1500:]}")
            return None
    return os.pathsep.join([str(classes), *(str(j) for j in jars)])


def timed(command: list[str], env: dict[str, str] | None = None,
          out: Path | None = None) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of a child process (stdout to ``out`` when given)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    if out is not None:
        with out.open("wb") as sink:
            subprocess.run(command, stdout=sink, check=True, env=env)
        text = ""
    else:
        text = subprocess.run(command, capture_output=True, text=True, check=True,
                              env=env).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), text


def median_range(values: list[float], scale: float = 1.0) -> str:
    ordered = sorted(v * scale for v in values)
    return f"{statistics.median(ordered):,.0f} ({ordered[0]:,.0f}–{ordered[-1]:,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fetch", action="store_true", help="Fetch the anchors first.")
    parser.add_argument("--cache", type=Path,
                        default=Path.home() / ".cache" / "evamed-compare")
    args = parser.parse_args()
    if args.fetch:
        fetch(args.cache)
    classpath = flink_ready(args.cache)
    opencep = args.cache / "OpenCEP"
    if not (opencep / "CEP.py").exists():
        print("OpenCEP: not fetched (run with --fetch; needs github.com): skipped")
    java = ["java", "-XX:ActiveProcessorCount=1", "-cp", classpath or ""]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp, "events.jsonl")
        write_events(events, args.events)
        n = args.events
        print(f"\n{n:,} events, {events.stat().st_size / 1e6:.1f} MB; load average "
              f"{os.getloadavg()[0]:.1f}; median (min–max) of {args.repeat} interleaved rounds, "
              "events/s")
        rows: dict[tuple[str, str], list[float]] = {}
        counts: dict[tuple[str, str], set[int]] = {}
        floors: list[float] = []
        for _ in range(args.repeat):
            floors.append(n / timed([sys.executable, "-c", FLOOR, str(events)])[1])
            for label, (mode, expr) in WORKLOADS.items():
                profiles = Path(tmp, "p.eva")
                profiles.write_text(CLASSES + f"profile P = {expr}\n")
                out = Path(tmp, "out.jsonl")
                wall, _, _ = timed([sys.executable, "-m", "mediator", "replay", "--profiles",
                                    str(profiles), "--events", str(events)], env, out)
                rows.setdefault((label, "evamed replay (wall)"), []).append(n / wall)
                counts.setdefault((label, "evamed replay (wall)"), set()).add(
                    sum(1 for _ in out.open("rb")))
                if classpath:
                    _, _, text = timed([*java, "FlinkCepBench", str(events), mode, "5"])
                    found, seconds = text.split()[-2:]
                    rows.setdefault((label, f"Flink CEP {FLINK_VERSION} (job)"), []).append(
                        n / float(seconds))
                    counts.setdefault((label, f"Flink CEP {FLINK_VERSION} (job)"), set()).add(
                        int(found))
                if (opencep / "CEP.py").exists() and mode == "any":
                    # OpenCEP's window includes its edge, like EVA's frame: 4 s (see above).
                    _, _, text = timed([sys.executable, "-c", OPENCEP_DRIVER, str(events), "4"],
                                       {**env, "PYTHONPATH": str(opencep)})
                    found, seconds = text.split()[-2:]
                    rows.setdefault((label, "OpenCEP (run)"), []).append(n / float(seconds))
                    counts.setdefault((label, "OpenCEP (run)"), set()).add(int(found))
        print(f"\nparse floor (orjson per line, CPU): {median_range(floors)}\n")
        print("| workload | system | events/s | matches | evamed ÷ it |\n|---|---|---:|---:|---:|")
        for label in WORKLOADS:
            ours = statistics.median(rows[(label, "evamed replay (wall)")])
            for (workload, system), rates in rows.items():
                if workload != label:
                    continue
                matched = counts[(workload, system)]
                print(f"| {label} | {system} | {median_range(rates)} | "
                      f"{', '.join(f'{c:,}' for c in sorted(matched))} | "
                      f"{ours / statistics.median(rates):.1f}× |")
        same = all(len({c for (w, _), cs in counts.items() if w == label for c in cs}) == 1
                   for label in WORKLOADS)
        print("\nmatch counts equal across systems: " + ("yes" if same else "NO (see the table)"))


if __name__ == "__main__":
    main()
