"""Dead letters as data (issue 24 item 3): every input the mediator refuses is kept in the
dead-letter log — at Publish, at a broker source's mapping, at the own feed's reader and the
services' late reports — listed by ``evamed dead-letters`` with its reason, seen by its own
client (an operator sees all), and published again in one command once fixed."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import paho.mqtt.client as mqtt
import pytest
import redis
from paho.mqtt.enums import CallbackAPIVersion

from adapters.federation import Late
from adapters.links import Link
from adapters.mqtt_source import MqttSource
from eva.admission import Reason
from eva.events import format_time
from mediator.client import MediatorClient, MediatorError
from mediator.dead_letters import DeadLetterLog
from mediator.metrics import Metrics
from mediator.pipeline import Pipeline
from mediator.security import add_client
from mediator.store.sqlite import SqliteStore
from tests.servers import MosquittoServer, RedisServer
from tests.test_door_e2e import Mediator
from tests.test_mqtt import wait_for
from tests.test_service_e2e import EVAMED, Process

NOW = time.time_ns() // 1000

CONFIG = """
max_event_bytes = 2048

[[services]]
name = "fleet"
group = "cg2"
address = "{service}"
types = ["truck.*"]

[[sources]]
name = "plant"
kind = "mqtt"
port = {mqtt}
backoff_initial = 0.1
max_event_bytes = 512

[[sources.rules]]
topic = "plant/+line/temp"
type = "plant.temp"
subject = "{{line}}"
time = {{field = "ts", format = "epoch_ms"}}
id = {{field = "seq"}}
non_json = "dead-letter"

[[sinks]]
name = "out"
port = {mqtt}
backoff_initial = 0.1

[[sources]]
name = "cellar"
kind = "redis"
url = "{redis}"
streams = ["cellar/a", "odd/x"]
start = "0"
block = 0.2
claim_idle = 0.5
consumer = "evamed-test"

[[sources.rules]]
topic = "cellar/+room"
type = "cellar.temp"
time = {{field = "ts", format = "epoch_ms"}}
id = {{field = "id"}}
"""


def cloud(ident: str, t: int, kind: str = "reading", source: str = "s", **extra: Any) -> str:
    return json.dumps({"specversion": "1.0", "id": ident, "source": source, "type": kind,
                       "time": format_time(t), **extra})


@pytest.fixture
def system(tmp_path: Path, mosquitto: MosquittoServer, redis_server: RedisServer
           ) -> Iterator[Mediator]:
    # An entry the source's consumer read in an earlier life and never acknowledged, deleted
    # since: taken in again at the start, it is gone (``deleted``).
    r = redis.Redis.from_url(redis_server.url)
    r.xgroup_create("cellar/a", "evamed", id="0", mkstream=True)
    gone = r.xadd("cellar/a", {"id": "c1", "ts": NOW // 1000})
    r.xreadgroup("evamed", "evamed-test", {"cellar/a": ">"})  # pending at the consumer
    r.xdel("cellar/a", gone)
    r.close()
    service = Process("base-service", "--group", "cg2", "--listen", "127.0.0.1:0")
    mediator: Mediator | None = None
    try:
        mediator = Mediator(tmp_path, CONFIG.format(service=service.address,
                                                    mqtt=mosquitto.port, redis=redis_server.url))
        yield mediator
    finally:
        if mediator is not None:
            mediator.close()
        service.stop()


def listed(mediator: Mediator, *args: str, token: str | None = None) -> list[dict[str, Any]]:
    """``evamed dead-letters --format json`` as the operator (or ``token``'s client)."""
    out = subprocess.run([EVAMED, "dead-letters", "--format", "json", "--last", "0",
                          "--server", f"127.0.0.1:{mediator.running.port}",
                          "--token", token or mediator.token, *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_every_kind_of_refusal_is_listed_by_evamed_dead_letters_with_its_reason(
        system: Mediator, redis_server: RedisServer) -> None:
    mediator = system
    alice = add_client(mediator.store, "alice", sources=["s"])
    port = f"127.0.0.1:{mediator.running.port}"
    mediator.client.add_profile('class T = type == "plant.temp"\nclass C = type == '
                                '"cellar.temp"\nprofile EachT = T\nprofile EachC = C\n',
                                name="each")
    plant = mediator.running.served.brokers.sources["plant"]
    assert isinstance(plant, MqttSource)
    wait_for(lambda: plant.status() == "SERVING" and bool(plant.topic_filters),
             what="the MQTT source subscribed")

    # Publish: each of the door's reasons, as alice.
    deep: Any = 1
    for _ in range(120):
        deep = [deep]
    with MediatorClient(port, alice) as client:
        reply = client.publish([
            cloud("ok", NOW), "{not json", cloud("big", NOW, data="x" * 4000),
            cloud("ok", NOW + 1), cloud("old", NOW - 10_000_000),
            cloud("typo", NOW + 10 * 86_400_000_000), cloud("truck", NOW, kind="truck.stop"),
            cloud("bobs", NOW, source="bob")])
    assert reply.accepted == 1
    assert [d.reason.split(":")[0] for d in reply.dead_letters] == [
        "malformed", "too_large", "duplicate", "late", "future", "misrouted", "forbidden"]

    # A broker's mapping: MQTT.
    device = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="dev")
    device.connect("127.0.0.1", int(plant.settings.port))
    device.loop_start()
    ms = NOW // 1000
    for topic, payload in [
            ("plant/l1/temp", b"not json at all"),                       # payload
            ("plant/l1/temp", json.dumps({"seq": 1}).encode()),           # time
            ("plant/l1/temp", json.dumps({"ts": ms}).encode()),           # id
            ("plant//temp", json.dumps({"seq": 2, "ts": ms}).encode()),   # attribute
            ("plant/l1/temp", json.dumps({"seq": 3, "ts": ms, "pad": "y" * 600}).encode()),
            ("plant/l1/temp", json.dumps({"seq": 4, "ts": ms, "deep": deep}).encode()),
            ("plant/l1/temp", json.dumps({"seq": 5, "ts": ms}).encode())]:  # taken
        device.publish(topic, payload, qos=1).wait_for_publish(10)
    device.loop_stop()
    device.disconnect()

    # Redis: a stream no rule maps.
    r = redis.Redis.from_url(redis_server.url)
    r.xadd("odd/x", {"id": "o1", "ts": ms})
    r.close()

    # The event log's reader: lines nobody's door wrote (another writer, another version) —
    # one that is no event, one behind what it handed on (here: behind an advance).
    mediator.client.publish([], advance_to=NOW + 5_000_000)
    own = mediator.running.served.pipeline._own
    wait_for(lambda: (own.state().watermark or 0) >= NOW + 5_000_000, what="the advance applied")
    writer = SqliteStore(mediator.store.path)
    writer.append_events(["{not an event", cloud("ancient", NOW - 3_600_000_000)])
    writer.close()
    mediator.running.served.pipeline.wake()

    want = {("publish", "malformed"), ("publish", "too_large"), ("publish", "duplicate"),
            ("publish", "late"), ("publish", "future"), ("publish", "misrouted"),
            ("publish", "forbidden"), ("plant", "payload"), ("plant", "time"), ("plant", "id"),
            ("plant", "attribute"),
            ("plant", "too_large"), ("plant", "malformed"), ("cellar", "topic"),
            ("cellar", "deleted"), ("mediator", "malformed"), ("mediator", "late")}
    wait_for(lambda: want <= {(d["source"], d["reason"]) for d in listed(mediator)}, 30,
             "every kind of dead letter")
    letters = listed(mediator)
    for letter in letters:  # every one says why, when, and holds what came (a deleted
        assert letter["detail"] and letter["time_us"], letter  # entry: nothing is left)
        assert letter["raw"] or letter["reason"] == "deleted", letter
    by = {(d["source"], d["reason"]): d for d in letters}
    assert by[("publish", "late")]["client"] == "alice"
    assert by[("publish", "late")]["id"] == "old" and by[("publish", "late")]["where"] == "event 4"
    assert "the limit is 2,048 (max_event_bytes)" in by[("publish", "too_large")]["detail"]
    assert "the limit is 512 (max_event_bytes)" in by[("plant", "too_large")]["detail"]
    assert by[("plant", "payload")]["raw"] == "not json at all"
    assert by[("plant", "attribute")]["where"] == "plant//temp"
    assert by[("plant", "time")]["kind"] == "payload"
    assert by[("mediator", "malformed")]["where"].startswith("event-log position")

    # The brokers an operator can watch: per source and sink, labelled by their names only.
    from prometheus_client.parser import text_string_to_metric_families

    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = mediator.running.served.metrics.render().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    wait_for(lambda: samples().get(("evamed_sink_acknowledged_total", (("sink", "out"),)),
                                   0) >= 1, 30, "the sink's composites acknowledged")
    seen = samples()
    assert seen[("evamed_source_messages_total", (("source", "plant"),))] == 7
    assert seen[("evamed_source_connected", (("source", "plant"),))] == 1
    assert ("evamed_source_lag", (("source", "cellar"),)) in seen
    assert seen[("evamed_dead_letters_total", (("reason", "payload"), ("source", "plant")))] == 1
    assert seen[("evamed_dead_letters_total", (("reason", "late"), ("source", "publish")))] == 1
    assert {dict(labels)["source"] for name, labels in seen
            if name == "evamed_events_in_total"} <= {"publish", "plant", "cellar"}
    assert seen[("evamed_sink_published_total", (("sink", "out"),))] >= 1
    assert ("evamed_sink_retries_total", (("sink", "out"),)) in seen
    assert seen[("evamed_sink_position", (("owner", "ops"), ("sink", "out"),
                                          ("subscription", "each")))] >= 1

    # Filters; a client sees only its own; the log line summarises each batch.
    assert {d["reason"] for d in listed(mediator, "--reason", "late")} == {"late"}
    assert {d["source"] for d in listed(mediator, "--source", "plant")} == {"plant"}
    mine = listed(mediator, token=alice)
    assert {d["source"] for d in mine} == {"publish"} and len(mine) == 7
    bob = add_client(mediator.store, "bob")
    assert listed(mediator, token=bob) == []
    with MediatorClient(port, bob) as client, pytest.raises(MediatorError) as refused:
        list(client.dead_letters(client="alice"))
    assert "only an operator" in str(refused.value)

    # Republish, fixed: a late event with its time corrected (as alice, its client) ...
    late = by[("publish", "late")]
    fixed = tmp_file(mediator, cloud("old", NOW + 10_000_000))
    out = subprocess.run([EVAMED, "dead-letters", "republish", str(late["position"]), "--file",
                          str(fixed), "--server", port, "--token", alice],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "accepted" in out.stdout
    # ... and a broker's payload without its time field, mapped again by its source's rules.
    no_time = by[("plant", "time")]
    with MediatorClient(port, mediator.token) as ops:
        again = ops.republish(no_time["position"], json.dumps({"seq": 1, "ts": ms + 10_000}))
        assert again.accepted == 1
        # As it was, it is refused again: a new letter.
        as_it_was = by[("plant", "payload")]
        assert ops.republish(as_it_was["position"]).dead_lettered == 1
    with MediatorClient(port, bob) as client, pytest.raises(MediatorError) as hidden:
        client.republish(late["position"])
    assert hidden.value.code.name == "NOT_FOUND"
    logged = {json.loads(e.line)["id"] for e in mediator.store.read_events(0)
              if e.line.startswith('{"')}
    assert {"old", "1"} <= logged
    marked = {d["position"]: d["republished_us"] for d in listed(mediator)}
    assert marked[late["position"]] and marked[no_time["position"]]
    assert not marked[as_it_was["position"]]


def tmp_file(mediator: Mediator, text: str) -> Path:
    path = Path(mediator.store.path).with_name("fixed.json")
    path.write_text(text)
    return path


def test_a_services_late_report_is_a_dead_letter_of_that_service(tmp_path: Path) -> None:
    """What an autonomous service reports behind an instant decided already (it was idle past
    its timeout) is dead-lettered by the pipeline: kept with the service as its source, its
    registration as the place, as a report (not republishable)."""
    store = SqliteStore(tmp_path / "m.db")
    metrics = Metrics()
    pipeline = Pipeline(store, dict[str, Link](), metrics=metrics,
                        letters=DeadLetterLog(store, metrics))
    pipeline._late([Late("fleet", "h1", "event 'a1' of 's1' at 1970-01-01T00:00:00.000010Z"),
                    Late("fleet", "h1", "an answer at 1970-01-01T00:00:00.000012Z: x")])
    kept = store.read_dead_letters(0)
    assert [(r.reason, r.source, r.where, r.kind) for r in kept] == [
        (Reason.LATE, "fleet", "registration h1", "report")] * 2
    assert "idle longer than its idle timeout" in kept[0].detail
    assert metrics.registry.get_sample_value(
        "evamed_dead_letters_total", {"source": "fleet", "reason": "late"}) == 2
    store.close()


def test_following_the_dead_letters_shows_each_as_it_is_kept(tmp_path: Path) -> None:
    """``evamed dead-letters --follow`` (ListDeadLetters with follow): the letters kept so far,
    then each new one as the mediator keeps it, until the client goes away."""
    mediator = Mediator(tmp_path, 'lateness = "0s"\n')
    try:
        mediator.client.publish([cloud("a", NOW), "{broken"])
        got: list[Any] = []
        follow = mediator.client.dead_letters(follow=True)

        def read() -> None:
            with contextlib.suppress(MediatorError):  # the client closed under it: the end
                for letter in follow:
                    got.append(letter)

        import threading

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_for(lambda: len(got) == 1, what="the letter kept before")
        mediator.client.publish([cloud("b", NOW - 1_000_000)])
        wait_for(lambda: len(got) == 2, what="the new letter")
        assert [(x.reason, x.id) for x in got] == [("malformed", ""), ("late", "b")]
    finally:
        mediator.close()


def test_a_negative_position_is_invalid_argument_not_internal(tmp_path: Path) -> None:
    """ListDeadLetters with ``after`` or ``last`` below 0 (found by ``make fuzz``: the store's
    check raised and the call ended INTERNAL with a traceback in the log)."""
    mediator = Mediator(tmp_path, "")
    try:
        for after, last in ((-1, 0), (0, -3), (-(1 << 63), 0)):
            with pytest.raises(MediatorError) as refused:
                list(mediator.client.dead_letters(after=after, last=last))
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, refused.value
            assert "0 or more" in str(refused.value)
    finally:
        mediator.close()
