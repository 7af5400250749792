"""Brokers through the mediator (issue 14): a real mosquitto (Debian's, started as the tests
start it: tests/servers.py) feeding ``evamed serve`` (its own process, SQLite store in a
temporary directory) through an MQTT source, and a client subscribed over gRPC; the publisher
and the client run in this process.

* **throughput**: N messages published as fast as the publisher goes, at QoS 0 and 1: events/s
  from the first publish until the client has the composite of the last one — every message
  taken in, appended to the event log, evaluated; one in ten notified (the profile's class
  filters on a payload field, so the broker sends every message and the mediator filters);
* **latency**: at a fixed rate (1,000/s) for some seconds: from the publish of a notified
  message to its notification at the client, p50/p99.

QoS 1 is bounded by the broker's in-flight window: the source acknowledges a message only once
its event is durably in the event log, so at most ``max_inflight_messages`` (mosquitto's
default 20) wait on one append; ``--inflight`` gives the windows to compare.

    .venv/bin/python benchmarks/brokers.py [--events 20000] [--rate 1000] [--seconds 5]
        [--inflight 20,1000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from mediator.client import MediatorClient, MediatorError
from tests.servers import MosquittoServer, free_port

EVAMED = str(Path(sys.executable).with_name("evamed"))
PROFILE = 'class A = type == "bench.e" and data.tag == "x"\nprofile P = A\n'


@contextmanager
def system(qos: int, inflight: int) -> Iterator[tuple[Received, mqtt.Client, int]]:
    """A broker (its in-flight window ``inflight``), a mediator with an MQTT source subscribing
    at ``qos``, a client subscribed to P and a device publishing to the broker: (what the
    client receives, the device, the mediator's metrics port)."""
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        broker = MosquittoServer(directory)
        # Saved every 30 min (mosquitto's default), not after every change as the tests'
        # broker is (which makes each QoS-1 message queued for a session a write of its file).
        broker.config.write_text(broker.config.read_text() + "autosave_on_changes false\n"
                                 f"autosave_interval 1800\nmax_inflight_messages {inflight}\n")
        broker.restart()
        try:
            with mediator(directory, broker.port, qos) as (client, metrics):
                received = Received(client)
                time.sleep(0.2)  # the stream is open
                device = publisher(broker.port)
                try:
                    yield received, device, metrics
                finally:
                    device.loop_stop()
                    device.disconnect()
                    client.close()
        finally:
            broker.stop()


@contextmanager
def mediator(directory: Path, port: int, qos: int) -> Iterator[tuple[MediatorClient, int]]:
    """``evamed serve`` with an MQTT source of the broker at ``port``, and a client that added
    P: (the client, the metrics port)."""
    metrics = free_port()
    config = directory / "mediator.toml"
    config.write_text(f"""
listen = "127.0.0.1:{free_port()}"
store = "sqlite:///{directory / 'mediator.db'}"
composer = "inprocess"
log_level = "WARNING"
metrics_port = {metrics}

[limits]
rate = 0

[[sources]]
name = "bench"
kind = "mqtt"
port = {port}
qos = {qos}

[[sources.rules]]
topic = "bench/+kind"
type = "bench.{{kind}}"
id = {{field = "n"}}
""")
    token = subprocess.run([EVAMED, "clients", "add", "bench", "--config", str(config)],
                           capture_output=True, text=True, check=True).stdout.strip()
    server = subprocess.Popen([EVAMED, "serve", "--config", str(config)], text=True,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert server.stdout is not None
        address = server.stdout.readline().split()[-1]
        client = MediatorClient(address, token, timeout=60)
        client.add_profile(PROFILE)
        deadline = time.monotonic() + 20
        while not all(s.status == "SERVING" for s in client.services()):
            if time.monotonic() > deadline:
                raise RuntimeError("the MQTT source did not connect")
            time.sleep(0.05)
        time.sleep(0.3)  # the broker has the source's subscription
        yield client, metrics
    finally:
        server.terminate()
        server.wait(30)


def publisher(port: int) -> mqtt.Client:
    device = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-device",
                         protocol=mqtt.MQTTv5)
    device.max_inflight_messages_set(1000)  # the publisher is not what is measured
    device.max_queued_messages_set(0)
    device.connect("127.0.0.1", port)
    device.loop_start()
    return device


def payload(n: int, notified: bool) -> bytes:
    return json.dumps({"n": n, "tag": "x" if notified else "-", "v": n % 100}).encode()


class Received:
    """The client's notifications, each one's arrival by its event's id (``n``)."""

    def __init__(self, client: MediatorClient) -> None:
        self.at: dict[str, float] = {}
        self.changed = threading.Condition()
        threading.Thread(target=self._read, args=(client,), daemon=True).start()

    def _read(self, client: MediatorClient) -> None:
        try:
            for note in client.subscribe(name="P"):
                with self.changed:
                    self.at[note.cloudevent["data"]["constituents"][0]] = time.perf_counter()
                    self.changed.notify_all()
        except (ValueError, MediatorError):  # the row is over: its client closed
            return

    def wait(self, ident: str, seconds: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: ident in self.at, seconds)


def events_in(metrics: int) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read()
    return int(sum(float(line.split()[-1]) for line in text.decode().splitlines()
                   if line.startswith("evamed_events_in_total")))


def throughput(count: int, qos: int, inflight: int) -> tuple[float, int, int]:
    """Events/s to the last composite, events taken in, composites received."""
    with system(qos, inflight) as (received, device, metrics):
        started = time.perf_counter()
        for n in range(count):
            device.publish("bench/e", payload(n, n % 10 == 0 or n == count - 1), qos=qos)
        device.publish("bench/e", payload(count, False), qos=qos)  # decides the last instant
        received.wait(str(count - 1), 120)
        elapsed = max(received.at.values(), default=time.perf_counter()) - started
        return count / elapsed, events_in(metrics), len(received.at)


def latency(rate: int, seconds: float, qos: int, inflight: int) -> list[float]:
    """Publish → client delays (s) of the notified messages (one in ten) at ``rate``/s."""
    total = int(rate * seconds)
    sent: dict[str, float] = {}
    with system(qos, inflight) as (received, device, _):
        started = time.perf_counter()
        for n in range(total + 1):
            pause = started + n / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            if n % 10 == 0 and n < total:
                sent[str(n)] = time.perf_counter()
            device.publish("bench/e", payload(n, n % 10 == 0 and n < total), qos=qos)
        received.wait(str(max(int(k) for k in sent)), 60)
        return [received.at[k] - t for k, t in sent.items() if k in received.at]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--inflight", default="20,1000",
                        help="The broker's in-flight windows (max_inflight_messages) to compare.")
    parser.add_argument("--quick", action="store_true", help="Small sizes (a smoke run).")
    args = parser.parse_args()
    windows = [int(n) for n in args.inflight.split(",")]
    if args.quick:
        args.events, args.seconds, windows = 2_000, 2.0, windows[:1]
    print(f"mosquitto → MQTT source → event log → pipeline → gRPC client; {args.events:,} "
          f"messages per throughput row, {args.rate:,}/s for {args.seconds:g} s per latency "
          "row, one message in ten notified")
    print(f"{'QoS':>3} {'in-flight':>9} {'events/s':>9} {'taken in':>9} {'notified':>9} "
          f"{'p50 ms':>7} {'p99 ms':>7}")
    for qos in (0, 1):
        for window in windows if qos == 1 else windows[:1]:
            rate, taken, notified = throughput(args.events, qos, window)
            ms = sorted(d * 1e3 for d in latency(args.rate, args.seconds, qos, window))
            q = statistics.quantiles(ms, n=100, method="inclusive")
            print(f"{qos:>3} {window if qos else '-':>9} {rate:>9,.0f} {taken:>9,} {notified:>9,} "
                  f"{q[49]:>7.1f} {q[98]:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
