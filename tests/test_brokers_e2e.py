"""Brokers wired into the running mediator, end to end with real processes (issue 14):
``evamed serve --config F`` with an MQTT source, a Redis Streams source and an MQTT sink, a real
mosquitto and a real redis-server (tests/servers.py), a device publishing over MQTT (QoS 1), a
subscription client, and a legacy consumer, ``mosquitto_sub``, on the sink's topics.

One scenario, in order, each step starting from what the one before left:

1. the client subscribes a document of two profiles — ``Each`` (one composite per reading: a
   per-event account of what reached the client) and ``HotThenAlarm`` — and the device
   publishes; a malformed payload among the readings is dead-lettered (the metrics say so)
   and the stream goes on;
2. mosquitto is SIGKILLed mid-stream and started again: no QoS-1 event lost, none twice;
3. the mediator is SIGKILLed and the device publishes while it is away; started again, it gets
   them from its persistent session at the broker, and the client resumes;
4. a Redis stream feeds the same profiles: its events reach them once;
5. a watermark ends the day: the event log holds each reading once, as the mapping makes it;
   the client has received exactly what ``evamed replay`` prints for those events, and
   ``mosquitto_sub`` has seen the same ``HotThenAlarm`` composites.

The events are stamped on arrival (the rules name no time field): across a broker restart the
paho device sends a message published between its CONNECT and the CONNACK before the backlog
it queued meanwhile (seen here on a loaded machine: one message before some 300 older ones), so
with the devices' times the older ones would be late beyond the allowed lateness
(docs/sources.md, "Delivery guarantees and their limits"; tests/test_door_e2e.py takes them in
with payload times within the lateness). So the reference is the event log itself, each event
checked against the mapping of what the device published.

The Redis source is configured first, so the planner gives it the classes (it covers them as
the MQTT source does, and ties go to the configured order): the MQTT broker is asked for its
topics only because the mediator asks every broker that can feed a live class
(mediator/brokers.py), and the Redis link evaluates the MQTT events from the event log.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from adapters.mapping import Mapped, Packet, SourceDeadLetter
from adapters.mapping import Mapping as EventMapping
from adapters.redis_source import RedisSourceConfig, entry_event
from eva.events import from_json_line
from mediator.client import MediatorClient, Notification
from mediator.config import MqttSourceConfig, load
from mediator.store.sqlite import SqliteStore
from tests.helpers import Reader
from tests.servers import MosquittoServer, RedisServer, free_port
from tests.test_mqtt import Publisher, wait_for
from tests.test_service_e2e import EVAMED, Process, cli

DOC = """\
class Temp = type == "plant.temp"
class Hot = type == "plant.temp" and data.v > 30
class Alarm = type == "plant.alarm"
profile Each = Temp
profile HotThenAlarm per data.line = ((last_dup(Hot); all_dup(Alarm))_1min)_all_pairs
"""
T0 = 1_700_000_000_000  # ms: the device's clock in its payloads (the rules stamp on arrival)
STEP = 100              # ms between readings
PHASES = (300, 700, 900)  # readings published by the end of steps 1, 2 and 3
MALFORMED_AT = 150


def reading(i: int) -> tuple[str, bytes]:
    """The device's i-th message: a temperature reading, every 25th an alarm."""
    line = f"l{i % 3}"
    body: dict[str, Any] = {"id": f"m{i}", "ts": T0 + i * STEP, "line": line}
    if i % 25 == 24:
        return f"plant/{line}/alarm", json.dumps(body).encode()
    return f"plant/{line}/temp", json.dumps({**body, "v": i % 50}).encode()


READINGS = sum(1 for i in range(PHASES[2]) if reading(i)[0].endswith("/temp"))
"""The temperature readings the device publishes over MQTT (QoS 1)."""


def configure(path: Path, mqtt: MosquittoServer, store: RedisServer, metrics: int) -> None:
    path.write_text(f"""
listen = "127.0.0.1:{free_port()}"
store = "sqlite:///{path.parent / 'mediator.db'}"
composer = "inprocess"
log_level = "WARNING"
metrics_port = {metrics}
lateness = "0s"  # stamped on arrival: in time order already, composites at once

[limits]
rate = 0

[[sources]]
name = "cellar"
kind = "redis"
url = "{store.url}/0"
streams = ["cellar/temp", "cellar/alarm"]
consumer = "e2e"

[[sources.rules]]
topic = "cellar/+kind"
type = "plant.{{kind}}"
id = {{field = "id"}}

[[sources]]
name = "plant"
kind = "mqtt"
port = {mqtt.port}
keepalive = 5
backoff_initial = 0.05
backoff_max = 0.5

[[sources.rules]]
topic = "plant/+line/temp"
type = "plant.temp"
source = "mqtt://plant/{{line}}"
id = {{field = "id"}}
non_json = "dead-letter"

[[sources.rules]]
topic = "plant/+line/alarm"
type = "plant.alarm"
source = "mqtt://plant/{{line}}"
id = {{field = "id"}}

[[sinks]]
name = "legacy"
port = {mqtt.port}
topic = "composites/{{profile}}/{{partition}}"
profiles = ["HotThenAlarm"]
backoff_initial = 0.05
backoff_max = 0.5
""")


class Consumer:
    """A legacy consumer: ``mosquitto_sub`` on a persistent session (QoS 1), printing each
    message's topic and payload; it reconnects by itself when the broker comes back."""

    def __init__(self, server: MosquittoServer) -> None:
        self.proc = subprocess.Popen(
            ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(server.port), "-V", "mqttv5",
             "-i", "legacy-consumer", "-c", "-x", "600", "-q", "1", "-t", "composites/#",
             "-F", "%t %p"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        import threading

        threading.Thread(target=self._read, daemon=True).start()
        wait_for(lambda: "as legacy-consumer" in server.log.read_text(), 10,
                 "mosquitto_sub connected")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def composites(self) -> list[dict[str, Any]]:
        return [json.loads(line.split(" ", 1)[1]) for line in self.lines]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def from_broker(mapping: EventMapping, topic: str, payload: bytes, at: int
                ) -> Mapped | SourceDeadLetter | None:
    """The event of an MQTT message stamped on arrival at ``at``."""
    return mapping.map(Packet(topic, payload, arrival_us=at))


def from_stream(config: RedisSourceConfig, stream: str, entry: str, fields: dict[bytes, bytes],
                at: int) -> Mapped | SourceDeadLetter:
    """The event of a stream entry (stamped with its entry id, whatever ``at``)."""
    return entry_event(config, stream, entry, fields)


def logged_lines(path: Path) -> list[str]:
    """The mediator's event log, read from its SQLite file (WAL: beside the running server)."""
    store = SqliteStore(str(path))
    try:
        out: list[str] = []
        after = 0
        while batch := store.read_events(after, 1000):
            out.extend(item.line for item in batch)
            after = batch[-1].position
        return out
    finally:
        store.close()


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = [line.split()[-1] for line in text.splitlines() if line.startswith(name)]
    return float(found[0]) if found else 0.0


def replayed(doc: Path, lines: list[str], tmp_path: Path) -> list[dict[str, Any]]:
    """What ``evamed replay`` prints for the document over ``lines``."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(line + "\n" for line in lines))
    out = subprocess.run([EVAMED, "replay", "--profiles", str(doc), "--events", str(trace)],
                         capture_output=True, text=True, timeout=60, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def by_profile(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        out.setdefault(e["data"]["profile"], []).append(e)
    return out


def each_of(notes: list[Notification], prefix: str) -> Counter[str]:
    """How often each reading (its id starting with ``prefix``) reached the client through
    ``Each``."""
    return Counter(c for n in notes if n.profile == "Each"
                   for c in n.cloudevent["data"]["constituents"] if c.startswith(prefix))


@pytest.mark.xdist_group("service")
def test_brokers_feed_a_served_mediator_through_crashes_and_a_sink_hands_composites_back(
        mosquitto: MosquittoServer, redis_server: RedisServer, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "mediator.toml"
    metrics_port = free_port()
    configure(config, mosquitto, redis_server, metrics_port)
    loaded = load(config, {})
    plant, cellar = loaded.sources[1], loaded.sources[0]
    assert isinstance(plant, MqttSourceConfig) and isinstance(cellar, RedisSourceConfig)
    doc = tmp_path / "plant.eva"
    doc.write_text(DOC)
    token = cli("clients", "add", "alice", "--operator", "--config", str(config)).strip()
    mediator = Process("serve", "--config", str(config))
    consumer = Consumer(mosquitto)
    device = Publisher(mosquitto)
    alice = MediatorClient(mediator.address, token, backoff=(0.05, 0.5))
    expected: dict[str, Callable[[int], Mapped | SourceDeadLetter | None]] = {}
    """Each event the log should hold, by id: its mapping, given the time it was stamped."""

    def publish(first: int, last: int) -> None:
        for i in range(first, last):
            topic, payload = reading(i)
            device.send(topic, payload)
            expected[f"m{i}"] = partial(from_broker, plant.mapping, topic, payload)
            time.sleep(0.002)
            if i == MALFORMED_AT:
                device.send("plant/l1/temp", b"not json")

    try:
        assert alice.add_profile(DOC, name="plant").plans == (
            "Each: equivalent, mediator", "HotThenAlarm: decompose, mediator")
        explained = alice.explain(name="plant").text
        assert "plant, class Temp: the broker filters topics plant/+/temp" in explained
        reader = Reader(alice.subscribe(name="plant"))
        wait_for(lambda: {s.name: (s.status, s.subscriptions) for s in alice.services()} == {
            "cellar": ("SERVING", 0), "plant": ("SERVING", 0)}, 20, "both sources serving")
        time.sleep(0.5)  # the broker has the source's SUBSCRIBE

        # 1. Readings flow; a malformed payload is dead-lettered and the stream goes on.
        publish(0, PHASES[0])
        wait_for(lambda: len(each_of(reader.got, "m")) >= 250, 30, "the first readings")
        assert metric(metrics_port, 'evamed_dead_letters_total{reason="payload",source="plant"}') == 1

        # 2. The broker is SIGKILLed mid-stream (once it saved what it acknowledged:
        # Publisher.saved) and started again.
        half = (PHASES[0] + PHASES[1]) // 2
        publish(PHASES[0], half)
        device.saved(half + 1)
        mosquitto.restart(down=0.5)
        publish(half, PHASES[1])
        wait_for(lambda: device.acked >= PHASES[1] + 1, 60, "the device's messages acknowledged")

        # 3. The mediator is SIGKILLed; what is published meanwhile waits at the broker.
        wait_for(lambda: len(each_of(reader.got, "m")) >= 600, 30, "readings before the kill")
        mediator.kill()
        publish(PHASES[1], PHASES[2])
        wait_for(lambda: device.acked >= PHASES[2] + 1, 30, "the device's messages acknowledged")
        mediator.start()
        wait_for(lambda: len(each_of(reader.got, "m")) >= READINGS - 1, 60,
                 "every reading up to the last but one (the last waits for a later instant)")

        # 4. A Redis stream feeds the same profiles, after everything the broker sent.
        cellar_client = redis.Redis.from_url(redis_server.url)
        entries: list[tuple[str, dict[str, str | int]]] = [
            ("cellar/temp", {"id": "r1", "v": 45, "line": "cellar"}),
            ("cellar/alarm", {"id": "r2", "line": "cellar"})]
        for stream, fields in entries:
            entry = cellar_client.xadd(stream, dict(fields)).decode()  # type: ignore[union-attr, arg-type]
            stored = {k.encode(): str(v).encode() for k, v in fields.items()}
            expected[str(fields["id"])] = partial(from_stream, cellar, stream, entry, stored)
            time.sleep(0.01)  # the alarm a later instant than the reading
        cellar_client.close()
        wait_for(lambda: each_of(reader.got, "r1")["r1"] == 1, 30, "the Redis reading")
        # The alarm is read by another XREAD, maybe after the reading's composite came back:
        # the day may end only once it is logged (after the end it would be late).
        wait_for(lambda: "r2" in {from_json_line(line).id
                                  for line in logged_lines(tmp_path / "mediator.db")},
                 30, "the Redis alarm in the event log")

        # 5. The day ends: the client has what replay gives, mosquitto_sub the same composites.
        end = time.time_ns() // 1000 + 3_600_000_000  # an hour ahead of every arrival
        assert alice.publish([], advance_to=end).accepted == 0
        lines = logged_lines(tmp_path / "mediator.db")
        events = [from_json_line(line) for line in lines]
        assert sorted(e.id for e in events) == sorted(expected)  # each once, nothing else
        for line, event in zip(lines, events, strict=True):
            mapped = expected[event.id](event.time)
            assert isinstance(mapped, Mapped) and mapped.line == line, (line, mapped)
        composites = replayed(doc, lines, tmp_path)
        reader.wait_for(len(composites), 60)
        time.sleep(0.5)  # nothing more comes
        got = [n.cloudevent for n in reader.got]
        assert by_profile(got) == by_profile(composites)
        pairs = by_profile(composites)["HotThenAlarm"]
        wait_for(lambda: {c["id"] for c in consumer.composites()} >= {c["id"] for c in pairs},
                 30, "the sink's composites at mosquitto_sub")
        time.sleep(0.5)
        seen = consumer.composites()
        assert {c["id"] for c in seen} == {c["id"] for c in pairs}
        assert all(c in pairs for c in seen)  # each as the client got it, and nothing else
        assert any(c["data"].get("partition") == "cellar" for c in seen)
    finally:
        alice.close()
        device.close()
        consumer.stop()
        mediator.stop()
    counts = each_of(reader.got, "m")
    repeats = Counter(c["id"] for c in seen)
    with capsys.disabled():
        print(f"\nbroker SIGKILLed once, mediator SIGKILLed once; {READINGS} QoS-1 readings "
              f"published: delivered {len(counts)}, lost {READINGS - len(counts)}, repeated "
              f"{sum(n - 1 for n in counts.values())}; sink: {len(pairs)} composites, "
              f"{len(repeats)} at mosquitto_sub, {sum(n - 1 for n in repeats.values())} twice")
    assert len(counts) == READINGS and set(counts.values()) == {1}
    # The sink's position survives the mediator's crash: it resent what was in flight at most,
    # not its subscription's log.
    assert sum(n - 1 for n in repeats.values()) < len(pairs) // 2
