"""MQTT against a real mosquitto (tests/servers.py): broker → source → event log, the broker
killed mid-stream, the source restarted on its persistent session, dead letters, topic filters
that follow the queries, and composites out through the sink to a real ``mosquitto_sub``."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.federation import Federation
from adapters.mapping import SourceDeadLetter, parse_mapping
from adapters.mqtt import BrokerSettings, Tls
from adapters.mqtt_sink import MqttSink
from adapters.mqtt_source import MqttSource
from eva.events import Event
from eva.notify import composite_line
from eva.parser import parse
from mediator.store.sqlite import SqliteStore
from tests.helpers import LogIngest, logged
from tests.servers import MosquittoServer
from transforms.federated import plan_federated

pytestmark = pytest.mark.xdist_group("mqtt")

READINGS = {"topic": "plant/+line/+sensor/reading", "type": "plant.{sensor}.reading",
            "source": "mqtt://{broker}/{line}"}
ALARMS = {"topic": "alarms/+line", "type": "plant.alarm", "source": "mqtt://{broker}/{line}"}
TEMP = '[type = "plant.temp.reading"]'
PROTOCOLS = ["5", "3.1.1"]


def events(log: LogIngest) -> list[Event]:
    return logged(log.store)


def data(log: LogIngest, key: str) -> list[object]:
    return [e.data[key] for e in logged(log.store)]


def event_log(path: Path, delay: float = 0.0) -> LogIngest:
    """What the mediator does with ``ingest(lines, ack)``, over a real SQLite event log."""
    return LogIngest(SqliteStore(str(path)), delay=delay)


def wait_for(condition: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.02)


def wait_while_growing(counts: Callable[[], list[int]], total: int, stall: float) -> None:
    """Until every count reaches ``total``, for as long as one of them grew within the last
    ``stall`` seconds (a rate that depends on the machine's load is not a deadline)."""
    seen, moved = counts(), time.monotonic()
    while min(seen) < total:
        time.sleep(0.1)
        now = counts()
        if now != seen:
            seen, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            return  # the caller's assertions say what is missing


def settings(server: MosquittoServer, protocol: str = "5") -> BrokerSettings:
    return BrokerSettings(port=server.port, protocol=protocol, backoff_initial=0.1,
                          backoff_max=1.0, keepalive=5)


def source(server: MosquittoServer, log: LogIngest, *, protocol: str = "5", rules: list | None = None,
           name: str = "plant", mediator: str = "test", **kwargs: object) -> MqttSource:
    mapping = parse_mapping(name, rules or [{**READINGS, "id": {"field": "seq"}}, ALARMS])
    return MqttSource(name, mapping, settings(server, protocol), log, mediator=mediator,
                      **kwargs)  # type: ignore[arg-type]


class Publisher:
    """A device: QoS 1 on a persistent session, paho's own reconnect (what a field device has);
    it counts the broker's acknowledgements."""

    def __init__(self, server: MosquittoServer, protocol: str = "5", client_id: str = "device-1"
                 ) -> None:
        v5 = protocol == "5"
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                                  clean_session=None if v5 else False)
        self.client.reconnect_delay_set(1, 1)
        self.acked = 0
        self.client.on_publish = self._acked
        if v5:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 600
            self.client.connect("127.0.0.1", server.port, keepalive=5, clean_start=False,
                                properties=properties)
        else:
            self.client.connect("127.0.0.1", server.port, keepalive=5)
        self.client.loop_start()

    def _acked(self, client: object, userdata: object, mid: int, reason: object,
               properties: object) -> None:
        self.acked += 1

    def send(self, topic: str, payload: dict | bytes) -> None:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.client.publish(topic, body, qos=1)

    def saved(self, count: int) -> None:
        """Until the broker acknowledged ``count`` messages, then a moment for its save: the
        point to kill it at. mosquitto saves its in-memory database after it acknowledges, so
        a kill in between loses a message the device was told was received — the broker's
        persistence, which no subscriber can make up for (a kill mid-stream lost one that way
        about one run in four on a saturated machine)."""
        wait_for(lambda: self.acked >= count, 60, "the device's messages acknowledged")
        time.sleep(0.3)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_events_flow_from_the_broker_into_the_event_log_and_the_link_evaluates_them(
        mosquitto: MosquittoServer, tmp_path: Path, protocol: str) -> None:
    log = event_log(tmp_path / "events.db")
    link = source(mosquitto, log, protocol=protocol)
    handle = link.subscribe('[type = "plant.temp.reading" & data.v > 2]')
    assert link.topic_filters == ["plant/+/temp/reading"]  # the type, at the broker
    assert "the mediator evaluates [type" in link.explain('[type = "plant.temp.reading" & data.v > 2]')
    link.start()
    wait_for(lambda: link.status() == "SERVING", what="the connection")
    device = Publisher(mosquitto, protocol)
    try:
        for i in range(5):
            device.send("plant/l1/temp/reading", {"seq": i, "v": i})
            device.send("plant/l1/hum/reading", {"seq": 100 + i, "v": i})  # not subscribed
        wait_for(lambda: len(events(log)) == 5, what="5 events in the log")
        time.sleep(0.2)
        assert link.counts.received == 5  # the broker filtered the humidity out
        taken = events(log)
        assert [e.type for e in taken] == ["plant.temp.reading"] * 5
        assert [e.id for e in taken] == ["0", "1", "2", "3", "4"]
        assert taken[0].source == "mqtt://plant/l1"
        assert taken[0].attributes["topic"] == "plant/l1/temp/reading"
        detected = link.publish(taken)[handle]  # the rest of the filter, at the mediator
        assert [d.constituents[0].data["v"] for d in detected] == [3, 4]
    finally:
        device.close()
        link.close()


def test_a_killed_broker_loses_no_qos1_message_and_repeats_none(
        mosquitto: MosquittoServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """mosquitto SIGKILLed twice mid-stream and started again: the sources reconnect with
    back-off and take what the broker kept for them. One source takes the id from the payload,
    the other derives it from the packet (docs/sources.md: what a derived id cannot tell apart)
    and holds its acknowledgements for the last 50 messages before each kill, so that they are
    in the event log but unacknowledged when the broker dies: the broker sends them again, the
    acknowledgements owed to the dead connection are skipped, and the copies are dropped by
    id. Each kill comes once the broker has saved the device's messages (Publisher.saved)."""
    total = 1500
    logs = {"payload id": event_log(tmp_path / "a.db"),
            "derived id": event_log(tmp_path / "b.db", delay=0.02)}
    links = {
        "payload id": source(mosquitto, logs["payload id"], name="plant"),
        "derived id": source(mosquitto, logs["derived id"], name="plant2",
                             rules=[READINGS, ALARMS]),
    }
    for link in links.values():
        link.subscribe(TEMP)
        link.start()
    wait_for(lambda: all(link.status() == "SERVING" for link in links.values()))
    device = Publisher(mosquitto)
    kills = 0
    try:
        at = (total // 3, 2 * total // 3)
        for i in range(total):
            if i + 50 in at:
                logs["derived id"].holding = True
            device.send(f"plant/l{i % 3}/temp/reading", {"seq": i, "v": i % 50})
            time.sleep(0.002)
            if i in at:
                device.saved(i + 1)
                held = links["derived id"].connection
                connects = held.connects
                mosquitto.restart(down=0.5)
                # Released once the source is connected again: what it owes the dead
                # connection is not acknowledged on the new one.
                wait_for(lambda: held.connects > connects, 60,  # noqa: B023
                         "the holding source connected again")
                logs["derived id"].holding = False
                kills += 1
        wait_for(lambda: device.acked >= total, 60, "the device's messages acknowledged")
        # The slow source takes ≥ 30 s (0.02 s an acknowledgement) and far longer on a loaded
        # machine: wait while either log grows; a loss shows below as a count, not a timeout.
        wait_while_growing(lambda: [len(set(data(log, "seq"))) for log in logs.values()],
                           total, stall=30)
        time.sleep(1.0)  # anything still coming would be a repeat
    finally:
        logs["derived id"].holding = False
        device.close()
        for link in links.values():
            link.close()
    with capsys.disabled():
        print(f"\nbroker SIGKILLed {kills}x mid-stream, {total} QoS-1 messages published:")
        for name, log in logs.items():
            seqs = Counter(data(log, "seq"))
            lost = total - len(seqs)
            repeated = sum(n - 1 for n in seqs.values())
            counts = links[name].counts
            print(f"  {name}: ingested {len(seqs)}, lost {lost}, repeated {repeated}, "
                  f"duplicates dropped by id {log.duplicates}, acks skipped (connection gone) "
                  f"{counts.acks_skipped}, connections {links[name].connection.connects}")
            assert lost == 0, name
            if name == "payload id":
                assert repeated == 0
        # (the held acknowledgements: owed to a dead connection, the messages sent again)
        assert links["derived id"].counts.acks_skipped > 0
        assert logs["derived id"].duplicates > 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_restarted_source_gets_what_was_published_while_it_was_away(
        mosquitto: MosquittoServer, tmp_path: Path, protocol: str) -> None:
    log = event_log(tmp_path / "events.db")
    remembered: list[str] = []
    first = source(mosquitto, log, protocol=protocol, remember=remembered.extend)
    first.subscribe(TEMP)
    first.start()
    wait_for(lambda: first.status() == "SERVING")
    device = Publisher(mosquitto, protocol)
    try:
        for i in range(3):
            device.send("plant/l1/temp/reading", {"seq": i, "v": i})
        wait_for(lambda: len(events(log)) == 3)
        first.close()  # the mediator stops; the broker keeps its session
        for i in range(3, 10):
            device.send("plant/l1/temp/reading", {"seq": i, "v": i})
        wait_for(lambda: device.acked == 10)
        again = source(mosquitto, log, protocol=protocol, known_filters=remembered)
        again.subscribe(TEMP)
        again.start()
        wait_for(lambda: len(events(log)) == 10, what="the 7 published meanwhile")
        assert data(log, "seq") == list(range(10))
        assert again.counts.received == 7
        assert again.connection.client_id == first.connection.client_id
        again.close()
    finally:
        device.close()


def test_a_batch_the_event_log_refuses_is_not_acknowledged_and_comes_again(
        mosquitto: MosquittoServer, tmp_path: Path) -> None:
    log = LogIngest(SqliteStore(str(tmp_path / "events.db")), fail=1)
    link = source(mosquitto, log)
    link.subscribe(TEMP)
    link.start()
    wait_for(lambda: link.status() == "SERVING")
    device = Publisher(mosquitto)
    try:
        for i in range(5):
            device.send("plant/l1/temp/reading", {"seq": i})
        wait_for(lambda: len(set(data(log, "seq"))) == 5, what="the 5 messages, resent")
        assert data(log, "seq") == [0, 1, 2, 3, 4]
        assert link.counts.ingest_failures == 1
        assert link.connection.connects == 2  # it reconnected so that the broker resends
    finally:
        device.close()
        link.close()


def test_malformed_payloads_are_dead_lettered_and_the_stream_goes_on(
        mosquitto: MosquittoServer, tmp_path: Path) -> None:
    log = event_log(tmp_path / "events.db")
    letters: list[SourceDeadLetter] = []
    rules = [{**READINGS, "id": {"field": "seq"}, "non_json": "dead-letter",
              "time": {"field": "at", "format": "rfc3339"}}]
    link = source(mosquitto, log, rules=rules, dead_letter=letters.append)
    link.subscribe(TEMP)
    link.start()
    wait_for(lambda: link.status() == "SERVING")
    device = Publisher(mosquitto)
    try:
        device.send("plant/l1/temp/reading", {"seq": 1, "at": "2024-05-01T10:00:00Z"})
        device.send("plant/l1/temp/reading", b"\x00garbage")
        device.send("plant/l2/temp/reading", {"seq": 2, "at": "yesterday"})
        device.send("plant/l1/temp/reading", {"at": "2024-05-01T10:00:02Z"})
        device.send("plant/l1/temp/reading", {"seq": 3, "at": "2024-05-01T10:00:03Z"})
        wait_for(lambda: len(events(log)) == 2 and len(letters) == 3)
    finally:
        device.close()
        link.close()
    assert data(log, "seq") == [1, 3]
    assert [(d.topic, d.reason) for d in letters] == [
        ("plant/l1/temp/reading", "payload"), ("plant/l2/temp/reading", "time"),
        ("plant/l1/temp/reading", "id")]
    assert "'yesterday' is not an RFC 3339 timestamp" in letters[1].detail
    assert link.counts.dead_lettered == 3


def test_the_broker_filters_follow_the_queries_as_they_come_and_go(
        mosquitto: MosquittoServer, tmp_path: Path) -> None:
    log = event_log(tmp_path / "events.db")
    link = source(mosquitto, log, rules=[READINGS])
    temp = link.subscribe(TEMP)
    link.start()
    wait_for(lambda: link.status() == "SERVING")
    device = Publisher(mosquitto)
    try:
        hum = link.subscribe('[type = "plant.hum.reading"]')
        assert link.topic_filters == ["plant/+/hum/reading", "plant/+/temp/reading"]
        time.sleep(0.3)  # the SUBSCRIBE reaches the broker
        device.send("plant/l1/hum/reading", {"n": 1})
        device.send("plant/l1/temp/reading", {"n": 2})
        wait_for(lambda: len(events(log)) == 2)
        link.unsubscribe(hum)
        assert link.topic_filters == ["plant/+/temp/reading"]
        time.sleep(0.3)
        device.send("plant/l1/hum/reading", {"n": 3})  # no longer asked for
        device.send("plant/l1/temp/reading", {"n": 4})
        wait_for(lambda: 4 in data(log, "n"))
        assert data(log, "n") == [1, 2, 4]
        # Overlapping filters become one (no message twice): l1's everything and every temp.
        link.subscribe('[source = "mqtt://plant/l1"]')
        assert link.topic_filters == ["plant/+/+/reading"]
        link.unsubscribe(temp)
        assert link.topic_filters == ["plant/l1/+/reading"]
    finally:
        device.close()
        link.close()


def test_a_wrong_password_keeps_the_source_connecting_and_the_right_one_serves(
        tmp_path: Path) -> None:
    server = MosquittoServer(tmp_path, users={"evamed": "s3cret"})
    log = event_log(tmp_path / "events.db")
    mapping = parse_mapping("plant", [READINGS])
    try:
        wrong = MqttSource("plant", mapping, BrokerSettings(
            port=server.port, username="evamed", password="nope", backoff_max=0.5), log)
        wrong.start()
        time.sleep(1.5)
        assert wrong.status() == "CONNECTING"
        assert "nope" not in repr(wrong.settings)
        wrong.close()
        right = MqttSource("plant", mapping, BrokerSettings(
            port=server.port, username="evamed", password="s3cret"), log)
        right.start()
        wait_for(lambda: right.status() == "SERVING")
        right.close()
    finally:
        server.stop()


def test_tls_with_the_brokers_ca_serves_and_without_it_keeps_connecting(tmp_path: Path) -> None:
    server = MosquittoServer(tmp_path, tls=True)
    log = event_log(tmp_path / "events.db")
    mapping = parse_mapping("plant", [READINGS])
    try:
        untrusted = MqttSource("plant", mapping, BrokerSettings(
            port=server.port, tls=Tls(), backoff_max=0.5), log)  # the system's CAs only
        untrusted.start()
        time.sleep(1.5)
        assert untrusted.status() == "CONNECTING"
        untrusted.close()
        trusted = MqttSource("plant", mapping, BrokerSettings(
            port=server.port, tls=Tls(ca_file=server.ca_file)), log)
        trusted.subscribe(TEMP)
        trusted.start()
        wait_for(lambda: trusted.status() == "SERVING")
        assert trusted.settings.address == f"mqtts://127.0.0.1:{server.port}"
        trusted.close()
    finally:
        server.stop()


DOC = """
class Hot = type == "plant.temp.reading" and data.v > 30
class Alarm = type == "plant.alarm"
profile HotThenAlarm per data.line = ((last_dup(Hot); all_dup(Alarm))_1min)_all_pairs
"""


@pytest.mark.parametrize("mode", ["structured", "binary"])
def test_composites_of_broker_events_reach_a_mosquitto_sub_through_the_sink(
        mosquitto: MosquittoServer, tmp_path: Path, mode: str) -> None:
    """Broker → source → event log → the profile planned over the source's link → composites
    → sink → a legacy consumer's ``mosquitto_sub``."""
    log = event_log(tmp_path / "events.db")
    link = source(mosquitto, log, rules=[READINGS, ALARMS])
    doc = parse(DOC, "profile")
    plans = [plan_federated(p, doc, [link.info], live=True) for p in doc.profiles]
    federation = Federation(doc, plans, {"plant": link})
    assert sorted(link.topic_filters) == ["alarms/+", "plant/+/temp/reading"]
    link.start()
    consumer = subprocess.Popen(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(mosquitto.port), "-V", "mqttv5",
         "-t", "evamed/#", "-F", "%t\t%C\t%P\t%p", "-W", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sink = MqttSink("legacy", settings(mosquitto), mode=mode, profiles={"HotThenAlarm"})
    sink.start()
    device = Publisher(mosquitto)
    try:
        wait_for(lambda: link.status() == sink.status() == "SERVING")
        time.sleep(0.5)  # mosquitto_sub has subscribed
        device.send("plant/l1/temp/reading", {"seq": 1, "v": 35, "line": "l1"})
        device.send("plant/l2/temp/reading", {"seq": 2, "v": 20, "line": "l2"})  # not hot
        device.send("alarms/l2", {"line": "l2"})
        device.send("alarms/l1", {"line": "l1"})
        wait_for(lambda: len(events(log)) == 4)
        notes = federation.push(events(log)) + federation.close()
        lines = [composite_line(n)[1] for n in notes]
        other = lines[0].replace('"profile": "HotThenAlarm"', '"profile": "Other"')
        assert sink.send([*lines, other, '{"not": "a composite"}']) == 1
        assert (sink.counts.published, sink.counts.skipped, sink.counts.refused) == (1, 1, 1)
        composite = lines[0]
        out, err = consumer.communicate(timeout=20)  # it ends 5 s after the last message
    finally:
        device.close()
        sink.close()
        link.close()
        federation.unsubscribe()
    assert len(out.splitlines()) == 1, (out, err)
    topic, content_type, properties, payload = out.splitlines()[0].split("\t")
    assert topic == "evamed/HotThenAlarm/l1"
    event = json.loads(composite)
    if mode == "structured":
        assert content_type == "application/cloudevents+json; charset=utf-8"
        assert json.loads(payload) == event
    else:
        assert content_type == "application/json"
        assert json.loads(payload) == event["data"]
        assert f"id:{event['id']}" in properties and "type:eva.composite" in properties
        assert "specversion:1.0" in properties and "ce_" not in properties
    assert event["data"]["partition"] == "l1"
