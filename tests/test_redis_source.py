"""The Redis Streams source against a real redis-server (tests/servers.py): entries reach the
event log in order, acknowledged only once they are there; a consumer killed mid-stream hands
its pending entries over (XAUTOCLAIM) and nothing is lost; a restarted consumer reads its own
pending entries again, the copies dropped by id; malformed entries are dead-lettered and
acknowledged; a redis-server killed and restarted (AOF) is reconnected to.

The mediator's side is a test double of ``ingest`` (tests/helpers.py ``LogIngest``): the events
appended to a real SqliteStore's event log, duplicates (source, id) dropped as Publish drops them.

Run as a module (``python -m tests.test_redis_source URL DB CONSUMER``) it is a consumer process
whose ingest is slow, for the test that kills it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from adapters.mapping import MappingConfigError, SourceDeadLetter
from adapters.redis_source import RedisSource, RedisSourceConfig, entry_event, parse_config
from mediator.store.sqlite import SqliteStore
from tests.helpers import LogIngest, logged
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
RULES = [{"topic": "plant/+line/temp", "type": "plant.temp", "subject": "{line}"},
         {"topic": "plant/+line/alarm", "type": "plant.alarm",
          "time": {"field": "ts", "format": "epoch_ms"}, "id": {"field": "alarm_id"}}]


def config(url: str, streams: list[str], **more: object) -> RedisSourceConfig:
    return parse_config("plant", {"url": url, "streams": streams, "rules": RULES,
                                  "block": 0.2, **more})


def wait_for(check: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:g} s for {what or check}")
        time.sleep(0.02)


def add(client: redis.Redis, stream: str, fields: dict[str, object]) -> str:
    """XADD; the entry id."""
    entry_id = client.xadd(stream, fields)  # type: ignore[arg-type]
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def pending(client: redis.Redis, stream: str, group: str = "evamed") -> int:
    return int(client.xpending(stream, group)["pending"])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "log.db")
    yield opened
    opened.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    opened = redis.Redis.from_url(redis_url)
    yield opened
    opened.close()


# ------------------------------------------------------------------ the mapping of an entry


def test_an_entry_maps_with_the_stream_as_topic_and_the_entry_id_as_event_id() -> None:
    cfg = config("redis://x", ["plant/a/temp"])
    out = entry_event(cfg, "plant/a/temp", "1700000000123-4", {b"celsius": b"21.5",
                                                               b"unit": b"C"})
    assert not isinstance(out, SourceDeadLetter)
    event = out.event
    assert (event.id, event.type, event.source, event.time) == (
        "plant/a/temp/1700000000123-4", "plant.temp", "redis://plant/plant/a/temp",
        1700000000123000)
    assert event.data == {"celsius": 21.5, "unit": "C"}  # a JSON value as JSON, else a string
    assert event.attributes["subject"] == "a" and event.attributes["topic"] == "plant/a/temp"
    again = entry_event(cfg, "plant/a/temp", "1700000000123-4", {b"celsius": b"21.5",
                                                                 b"unit": b"C"})
    assert again == out  # a redelivery is the same event, the same id


def test_an_entry_takes_its_time_and_id_from_fields_when_the_rule_says_so() -> None:
    cfg = config("redis://x", ["plant/b/alarm"])
    out = entry_event(cfg, "plant/b/alarm", "5-0", {b"ts": b"1700000000000",
                                                    b"alarm_id": b"\"A-7\""})
    assert not isinstance(out, SourceDeadLetter)
    assert (out.event.id, out.event.time) == ("A-7", 1_700_000_000_000_000)


def test_a_cloudevent_field_is_taken_whole_and_a_payload_field_as_the_payload() -> None:
    line = json.dumps({"specversion": "1.0", "id": "e1", "source": "s", "type": "t",
                       "time": "2024-01-01T00:00:00Z", "data": {"x": 1}}, indent=1)
    cfg = config("redis://x", ["plant/a/temp"], payload_field="body")
    whole = entry_event(cfg, "plant/a/temp", "1-0", {b"ce": line.encode()})
    assert not isinstance(whole, SourceDeadLetter)
    assert (whole.event.id, whole.event.data) == ("e1", {"x": 1}) and "\n" not in whole.line
    binary = entry_event(cfg, "plant/a/temp", "1-1", {b"body": b"\xff\x00raw"})
    assert not isinstance(binary, SourceDeadLetter)
    assert binary.event.attributes["data_base64"] == "/wByYXc="


@pytest.mark.parametrize(("fields", "reason", "says"), [
    ({b"ce": b"{not json"}, "malformed", "field 'ce' is not a CloudEvent"),
    ({b"ce": b'{"specversion": "1.0"}'}, "malformed", "missing required attribute"),
    ({b"x": b"\xff"}, "payload", "field 'x' is not UTF-8 (byte 1)"),
    ({}, "deleted", "deleted from the stream"),
])
def test_an_entry_that_cannot_be_mapped_is_a_dead_letter_naming_stream_entry_and_reason(
        fields: dict[bytes, bytes], reason: str, says: str) -> None:
    out = entry_event(config("redis://x", ["plant/a/temp"]), "plant/a/temp", "9-3", fields)
    assert isinstance(out, SourceDeadLetter)
    assert (out.topic, out.reason) == ("plant/a/temp", reason)
    assert out.detail.startswith("entry 9-3: ") and says in out.detail


def test_an_alarm_without_its_time_field_and_a_stream_no_rule_maps_are_dead_letters() -> None:
    cfg = config("redis://x", ["plant/a/alarm", "other"])
    missing = entry_event(cfg, "plant/a/alarm", "1-0", {b"alarm_id": b"1"})
    assert isinstance(missing, SourceDeadLetter) and missing.reason == "time"
    unmapped = entry_event(cfg, "other", "1-0", {b"x": b"1"})
    assert isinstance(unmapped, SourceDeadLetter) and unmapped.reason == "topic"
    assert "no rule's topic matches the stream" in unmapped.detail


@pytest.mark.parametrize(("raw", "says"), [
    ({"url": "http://x", "streams": ["s"]}, "url is a URL of scheme 'http', expected 'redis://"),
    ({"url": "redis://x", "streams": []}, "streams is [], expected a list of distinct"),
    ({"url": "redis://x", "streams": ["s"], "colour": 1}, "unknown key(s) colour"),
    ({"url": "redis://x", "streams": ["s"], "claim_idle": -1}, "claim_idle is -1, expected"),
    ({"url": "redis://x", "streams": ["s"], "start": "now"}, "start is 'now', expected"),
    ({"url": "redis://x", "streams": ["s"], "rules": [{"topic": "a"}]}, "rule 1: 'type' is"),
])
def test_a_bad_configuration_says_which_key_what_was_found_and_what_is_expected(
        raw: dict[str, object], says: str) -> None:
    with pytest.raises(MappingConfigError) as caught:
        parse_config("plant", raw)
    assert says in str(caught.value) and "source 'plant'" in str(caught.value)


def test_the_source_is_a_cg0_link_covering_what_its_rules_produce() -> None:
    source = RedisSource(config("redis://127.0.0.1:1", ["plant/a/temp"]), lambda lines, ack: None)
    assert source.info.group == "cg0"
    assert source.info.coverage.types == ("plant.temp", "plant.alarm")
    assert source.info.coverage.sources == ("*",)  # every logged event of those types
    handle = source.subscribe('[type = "plant.temp"]')
    event = entry_event(source.config, "plant/a/temp", "1-0", {b"v": b"1"})
    assert not isinstance(event, SourceDeadLetter)
    found = source.publish([event.event])
    assert [d.constituents[0].id for d in found[handle]] == ["plant/a/temp/1-0"]
    assert source.status() == "CONNECTING"  # never started
    source.close()


# ------------------------------------------------------------------ against redis-server


def test_entries_of_several_streams_reach_the_log_in_order_and_are_acknowledged(
        redis_url: str, client: redis.Redis, store: SqliteStore) -> None:
    streams = ["plant/a/temp", "plant/b/temp"]
    ingest = LogIngest(store)
    source = RedisSource(config(redis_url, streams, start="0"), ingest)
    added = {s: [add(client, s, {"n": n}) for n in range(150)] for s in streams}
    source.start()
    try:
        wait_for(lambda: store.event_head() == 300, what="300 events in the log")
        wait_for(lambda: all(pending(client, s) == 0 for s in streams), what="every XACK")
        added["plant/a/temp"].append(add(client, "plant/a/temp", {"n": 150}))
        wait_for(lambda: store.event_head() == 301, what="a later entry")
    finally:
        source.close()
    events = logged(store)
    for stream in streams:
        mine = [e for e in events if e.attributes["topic"] == stream]
        assert [e.id for e in mine] == [f"{stream}/{i}" for i in added[stream]]
        assert [e.data["n"] for e in mine] == list(range(len(added[stream])))
    times = [e.time for e in events]
    assert times == sorted(times)  # one read of two streams is handed over in time order
    assert source.counts.acked == 301 and ingest.duplicates == 0


def test_a_group_created_at_the_end_skips_history_and_close_is_prompt(
        redis_url: str, client: redis.Redis, store: SqliteStore) -> None:
    client.xadd("plant/a/temp", {"n": "before"})
    source = RedisSource(config(redis_url, ["plant/a/temp"]), LogIngest(store))
    source.start()
    wait_for(lambda: source.status() == "SERVING", what="the connection")
    client.xadd("plant/a/temp", {"n": "after"})
    wait_for(lambda: store.event_head() == 1, what="the entry added after the group")
    began = time.monotonic()
    source.close()
    assert time.monotonic() - began < 2.0
    assert [e.data["n"] for e in logged(store)] == ["after"]


def test_malformed_entries_are_dead_lettered_and_acknowledged_and_the_stream_goes_on(
        redis_url: str, client: redis.Redis, store: SqliteStore) -> None:
    letters: list[SourceDeadLetter] = []
    source = RedisSource(config(redis_url, ["plant/a/temp", "plant/a/alarm"], start="0"),
                         LogIngest(store), dead_letter=letters.append)
    good = add(client, "plant/a/temp", {"n": 1})
    poison = add(client, "plant/a/temp", {"ce": "{broken"})
    binary = add(client, "plant/a/temp", {"x": b"\xfe"})
    untimed = add(client, "plant/a/alarm", {"alarm_id": "7"})
    after = add(client, "plant/a/temp", {"n": 2})
    source.start()
    try:
        wait_for(lambda: store.event_head() == 2 and len(letters) == 3, what="2 events, 3 letters")
        wait_for(lambda: pending(client, "plant/a/temp") + pending(client, "plant/a/alarm") == 0,
                 what="the dead letters acknowledged")
    finally:
        source.close()
    assert [e.id for e in logged(store)] == [f"plant/a/temp/{good}", f"plant/a/temp/{after}"]
    assert sorted((x.topic, x.detail.split(":")[0], x.reason) for x in letters) == sorted([
        ("plant/a/temp", f"entry {poison}", "malformed"),
        ("plant/a/temp", f"entry {binary}", "payload"),
        ("plant/a/alarm", f"entry {untimed}", "time")])
    assert source.counts.dead_lettered == 3


def test_a_consumer_restarted_under_its_name_takes_its_own_pending_entries_in_again(
        redis_url: str, client: redis.Redis, store: SqliteStore) -> None:
    """The mediator appended, then died before acknowledging: the entries stay pending at the
    consumer; its next incarnation reads them again, and the copies are dropped by id."""
    for n in range(40):
        client.xadd("plant/a/temp", {"n": n})
    first = RedisSource(config(redis_url, ["plant/a/temp"], start="0"),
                        LogIngest(store, ack=False))
    first.start()
    wait_for(lambda: store.event_head() == 40, what="40 events")
    first.close()
    assert pending(client, "plant/a/temp") == 40
    ingest = LogIngest(store)
    second = RedisSource(config(redis_url, ["plant/a/temp"]), ingest)
    second.start()
    try:
        wait_for(lambda: pending(client, "plant/a/temp") == 0, what="the pending entries acked")
    finally:
        second.close()
    assert second.counts.recovered == 40 and ingest.duplicates == 40
    assert [e.data["n"] for e in logged(store)] == list(range(40))


def test_acks_may_come_later_from_another_thread_and_bound_what_is_in_flight(
        redis_url: str, client: redis.Redis, store: SqliteStore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """XACK follows the mediator's ack whenever it comes; with MAX_IN_FLIGHT entries handed
    over and not acknowledged, the source reads no further."""
    monkeypatch.setattr("adapters.redis_source.MAX_IN_FLIGHT", 10)
    held: list[Callable[[], None]] = []

    def later(lines: list[str], ack: Callable[[], None]) -> None:
        store.append_events(lines)
        held.append(ack)

    source = RedisSource(config(redis_url, ["plant/a/temp"], start="0", count=5), later)
    for n in range(30):
        client.xadd("plant/a/temp", {"n": n})
    source.start()
    try:
        wait_for(lambda: store.event_head() == 10, what="the first 10")
        time.sleep(0.5)
        assert store.event_head() == 10 and pending(client, "plant/a/temp") == 10
        deadline = time.monotonic() + 20
        while store.event_head() < 30 and time.monotonic() < deadline:
            if held:
                threading.Thread(target=held.pop(0)).start()
            time.sleep(0.01)
        for ack in held:
            ack()
        wait_for(lambda: pending(client, "plant/a/temp") == 0, what="every XACK")
    finally:
        source.close()
    assert [e.data["n"] for e in logged(store)] == list(range(30))


def test_an_ingest_that_fails_is_retried_and_nothing_is_lost(
        redis_url: str, client: redis.Redis, store: SqliteStore) -> None:
    ingest = LogIngest(store, fail=3)
    source = RedisSource(config(redis_url, ["plant/a/temp"], start="0"), ingest)
    for n in range(25):
        client.xadd("plant/a/temp", {"n": n})
    source.start()
    try:
        wait_for(lambda: store.event_head() == 25, what="25 events")
        wait_for(lambda: pending(client, "plant/a/temp") == 0, what="every XACK")
    finally:
        source.close()
    assert [e.data["n"] for e in logged(store)] == list(range(25))
    assert ingest.calls >= 4 and source.counts.connections >= 2


class Producer(threading.Thread):
    """XADDs ``total`` entries to ``stream`` at about ``rate`` a second, each retried until the
    server acknowledges it (through a restart): ``ids`` are the acknowledged ones."""

    def __init__(self, url: str, stream: str, total: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self.stream, self.total, self.rate = stream, total, rate
        self.ids: list[str] = []

    def run(self) -> None:
        for n in range(self.total):
            while True:
                try:
                    self.ids.append(add(self.client, self.stream, {"n": n}))
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            time.sleep(1 / self.rate)
        self.client.close()


def tally(label: str, published: list[str], stream: str, store: SqliteStore,
          duplicates: int) -> tuple[int, int]:
    ids = [e.id for e in logged(store)]
    wanted = {f"{stream}/{i}" for i in published}
    lost = len(wanted - set(ids))
    repeated = len(ids) - len(set(ids))
    print(f"\n{label}: published {len(published)}, ingested {len(set(ids) & wanted)}, "
          f"lost {lost}, repeated {repeated} (copies dropped by id: {duplicates})")
    return lost, repeated


def test_a_consumer_process_killed_mid_stream_hands_its_pending_entries_over(
        redis_url: str, client: redis.Redis, store: SqliteStore, tmp_path: Path) -> None:
    stream = "plant/a/temp"
    client.xgroup_create(stream, "evamed", id="0", mkstream=True)
    producer = Producer(redis_url, stream, total=1500, rate=1500)
    producer.start()
    db = str(tmp_path / "log.db")
    consumer = subprocess.Popen(
        [sys.executable, "-m", "tests.test_redis_source", redis_url, db, "doomed"], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for(lambda: store.event_head() >= 300, timeout=30, what="the consumer's first 300")
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(10)
        held = client.xpending(stream, "evamed")
        assert held["pending"] > 0 and held["consumers"][0]["name"] == b"doomed"
        producer.join(30)
        ingest = LogIngest(store)
        heir = RedisSource(config(redis_url, [stream], claim_idle=0.3), ingest)
        heir.start()
        try:
            wait_for(lambda: store.event_head() >= len(producer.ids)
                     and pending(client, stream) == 0, timeout=30, what="every entry")
        finally:
            heir.close()
    finally:
        if consumer.poll() is None:
            consumer.kill()
    assert heir.counts.claimed >= held["pending"]
    lost, repeated = tally("consumer SIGKILLed", producer.ids, stream, store, ingest.duplicates)
    assert (lost, repeated) == (0, 0)
    assert [e.data["n"] for e in logged(store)] == list(range(1500))


def test_a_redis_server_killed_and_restarted_is_reconnected_to(
        tmp_path: Path, store: SqliteStore) -> None:
    server = RedisServer(tmp_path, appendonly=True)
    stream = "plant/a/temp"
    ingest = LogIngest(store)
    source = RedisSource(config(server.url, [stream], start="0"), ingest)
    producer = Producer(server.url, stream, total=600, rate=600)
    try:
        source.start()
        producer.start()
        wait_for(lambda: store.event_head() >= 200, what="the first 200")
        server.kill()
        wait_for(lambda: source.status() == "CONNECTING", what="the source to notice")
        time.sleep(0.5)
        server.start()
        producer.join(30)
        check = redis.Redis(port=server.port)
        wait_for(lambda: store.event_head() >= len(producer.ids)
                 and pending(check, stream) == 0, timeout=30, what="every entry")
        check.close()
    finally:
        source.close()
        server.stop()
    lost, repeated = tally("redis-server SIGKILLed", producer.ids, stream, store,
                           ingest.duplicates)
    assert (lost, repeated) == (0, 0) and source.counts.connections >= 2


def _consume(url: str, db: str, consumer: str) -> None:
    """A consumer process with a slow ingest, until it is killed."""
    store = SqliteStore(db)
    source = RedisSource(config(url, ["plant/a/temp"], consumer=consumer, count=50),
                         LogIngest(store, delay=0.02))
    source.start()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    _consume(*sys.argv[1:4])
