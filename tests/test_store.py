"""The stores (issue 13, part 4): one contract, run against SQLite (a file in tmp_path) and Redis
(a real redis-server per test), then what only one of them has (files, processes, URLs)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from mediator.store import (
    ClientRecord,
    RedisStore,
    RetentionError,
    SqliteStore,
    Store,
    StoreError,
    SubscriptionRecord,
    open_store,
    parse_store_url,
)
from mediator.store.base import SCHEMA_VERSION, DeadLetterRecord
from mediator.store.redis import redis_options
from tests.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened: Store
    if request.param == "sqlite":
        opened = SqliteStore(tmp_path / "store.db")
    else:
        opened = RedisStore(request.getfixturevalue("redis_url"))
    yield opened
    opened.close()


def subscription(owner: str = "ann", name: str = "P1", start: int = 0) -> SubscriptionRecord:
    return SubscriptionRecord(owner, name, "profile P1: A ;; B", 1_000, start, None, "[]")


def items(*ids: str) -> list[tuple[str, bytes]]:
    return [(i, f'{{"id": "{i}"}}'.encode()) for i in ids]


def positions(store: Store, owner: str = "ann", name: str = "P1", after: int = 0) -> list[int]:
    return [n.position for n in store.read_notifications(owner, name, after)]


# -- the event log


def test_event_positions_start_at_one_and_increase_by_one(store: Store) -> None:
    assert store.event_head() == 0
    assert store.append_events(["a", "b", "c"]) == 3
    assert store.append_events(["d"]) == 4
    assert store.append_events([]) == 4
    assert [(e.position, e.line) for e in store.read_events(0)] == [
        (1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert store.event_head() == 4


def test_read_events_after_a_position_with_a_limit(store: Store) -> None:
    store.append_events([f"e{i}" for i in range(1, 11)])
    assert [e.position for e in store.read_events(3, limit=4)] == [4, 5, 6, 7]
    assert [e.line for e in store.read_events(8)] == ["e9", "e10"]
    assert store.read_events(10) == [] and store.read_events(99) == []


def test_trimmed_event_positions_are_never_given_again(store: Store) -> None:
    store.append_events(["a", "b", "c"])
    assert store.trim_events(3) == 2
    assert [e.line for e in store.read_events(0)] == ["c"]
    assert store.trim_events(10) == 1 and store.read_events(0) == []
    assert store.append_events(["d"]) == 4
    assert [(e.position, e.line) for e in store.read_events(0)] == [(4, "d")]


# -- notification logs


def test_notifications_are_appended_in_order_and_known_ids_skipped(store: Store) -> None:
    store.put_subscription(subscription())
    first = store.append_notifications("ann", "P1", items("x", "y", "x"))
    assert [(n.position, n.composite_id) for n in first] == [(1, "x"), (2, "y")]
    assert first[0].payload == b'{"id": "x"}'
    second = store.append_notifications("ann", "P1", items("y", "z"))
    assert [(n.position, n.composite_id) for n in second] == [(3, "z")]
    assert store.read_notifications("ann", "P1", 0) == first + second
    assert store.append_notifications("ann", "P1", []) == []


def test_a_composite_id_is_still_skipped_after_its_entry_was_trimmed(store: Store) -> None:
    """A restart replays the whole event log: a composite whose entry retention dropped must not
    come back as new."""
    store.put_subscription(subscription())
    store.append_notifications("ann", "P1", items("a", "b", "c"))
    assert store.trim_notifications("ann", "P1", keep=1) == 2
    assert store.append_notifications("ann", "P1", items("a", "b", "c", "d")) == [
        n for n in store.read_notifications("ann", "P1", 3) if n.composite_id == "d"]
    assert positions(store, after=2) == [3, 4]


def test_read_notifications_after_a_position_with_a_limit(store: Store) -> None:
    store.put_subscription(subscription())
    store.append_notifications("ann", "P1", items(*"abcdef"))
    assert positions(store, after=2) == [3, 4, 5, 6]
    assert [n.composite_id for n in store.read_notifications("ann", "P1", 1, limit=2)] == ["b", "c"]
    assert positions(store, after=6) == [] and positions(store, after=60) == []


def test_a_resume_position_older_than_the_oldest_kept_is_a_retention_error(store: Store) -> None:
    store.put_subscription(subscription())
    store.append_notifications("ann", "P1", items(*"abcdef"))
    store.trim_notifications("ann", "P1", keep=3)          # keeps 4, 5, 6
    assert positions(store, after=3) == [4, 5, 6]          # saw 3: misses nothing
    with pytest.raises(RetentionError) as refused:
        store.read_notifications("ann", "P1", 2)           # would miss 3
    assert str(refused.value).startswith(
        "resume token position 2 of subscription ann/P1 is older than the oldest kept, 4; "
        "the log keeps the newest 3")
    store.trim_notifications("ann", "P1", keep=0)          # everything
    assert positions(store, after=6) == []
    with pytest.raises(RetentionError, match="oldest kept, 7; the log keeps the newest 0"):
        store.read_notifications("ann", "P1", 5)


def test_notification_bounds_are_first_kept_and_head(store: Store) -> None:
    assert store.notification_bounds("ann", "P1") == (0, 0)    # unknown
    store.put_subscription(subscription())
    assert store.notification_bounds("ann", "P1") == (0, 0)    # nothing appended
    store.append_notifications("ann", "P1", items(*"abcd"))
    assert store.notification_bounds("ann", "P1") == (1, 4)
    assert store.trim_notifications("ann", "P1", keep=2) == 2
    assert store.notification_bounds("ann", "P1") == (3, 4)
    assert store.trim_notifications("ann", "P1", keep=2) == 0
    store.trim_notifications("ann", "P1", keep=0)
    assert store.notification_bounds("ann", "P1") == (5, 4)    # all trimmed
    assert [n.position for n in store.append_notifications("ann", "P1", items("e"))] == [5]


def test_a_subscription_not_stored_gets_no_log(store: Store) -> None:
    assert store.append_notifications("ann", "gone", items("a")) == []
    assert store.read_notifications("ann", "gone", 0) == []
    assert store.trim_notifications("ann", "gone", keep=0) == 0
    assert store.subscription("ann", "gone") is None


def test_bad_positions_limits_and_retentions_are_value_errors(store: Store) -> None:
    store.put_subscription(subscription())
    for read in (lambda: store.read_events(-1), lambda: store.read_events(0, limit=0),
                 lambda: store.read_notifications("ann", "P1", -1),
                 lambda: store.read_notifications("ann", "P1", 0, limit=0),
                 lambda: store.trim_notifications("ann", "P1", keep=-1)):
        with pytest.raises(ValueError, match=r"got -1|got 0"):
            read()


# -- records


def test_a_link_log_appends_each_message_number_once_in_order(store: Store) -> None:
    """An autonomous service's messages (issue 23): a message sent again after a reconnect
    (its number not after the newest appended) is skipped; positions go on from one."""
    assert store.link_bounds("traffic") == (0, 0)
    assert store.append_link("traffic", [(1, b"m1"), (2, b"m2")]) == (2, 2)
    assert store.append_link("traffic", [(2, b"again"), (3, b"m3"), (1, b"old")]) == (3, 3)
    assert [(m.position, m.number, m.payload) for m in store.read_link("traffic", 0)] == [
        (1, 1, b"m1"), (2, 2, b"m2"), (3, 3, b"m3")]
    assert [m.number for m in store.read_link("traffic", 1, limit=1)] == [2]
    assert store.link_bounds("traffic") == (3, 3)
    assert store.read_link("fleet", 0) == [] and store.link_bounds("fleet") == (0, 0)


def test_a_link_log_renumbered_takes_the_services_new_numbers_and_keeps_its_positions(
        store: Store) -> None:
    store.append_link("traffic", [(7, b"a"), (8, b"b")])
    assert store.trim_link("traffic", 2) == 1
    store.renumber_link("traffic")
    assert store.append_link("traffic", [(1, b"c")]) == (3, 1)
    assert [(m.position, m.number) for m in store.read_link("traffic", 0)] == [(2, 8), (3, 1)]


def test_the_composer_log_keeps_its_lines_in_order_and_answers_for_its_events_by_id(
        store: Store) -> None:
    """The Spark composer's input (issue 23 item 4): lines from position 1 in order, each
    event's line found by (source, id) — or by id alone, the newest of that id — until it is
    trimmed; a watermark line (no id) is never found; a trim drops the lookups with the lines
    (a newer line of the same id stays found)."""
    from mediator.store.base import ComposerLine

    a = ComposerLine('{"id": "e1"}', 10, "urn:a/b", "e1", "a", (("ab", "q-1"),))
    b = ComposerLine('{"id": "e1"}', 11, "urn:c", "e1", "c")
    mark = ComposerLine('{"evamed:watermark": 11}', 11)
    assert store.composer_head() == 0
    assert store.append_composer([a, mark]) == 2
    assert store.append_composer([b, mark]) == 4
    assert [(c.position, c.id, c.time) for c in store.read_composer(0)] == [
        (1, "e1", 10), (2, "", 11), (3, "e1", 11), (4, "", 11)]
    assert store.read_composer(1, limit=1) == [replace(mark, position=2)]
    found = store.composer_events([("urn:a/b", "e1"), ("", "e1"), ("urn:x", "e1"), ("", "")])
    assert found == {("urn:a/b", "e1"): replace(a, position=1),
                     ("", "e1"): replace(b, position=3)}
    assert store.trim_composer(3) == 2
    assert store.composer_events([("urn:a/b", "e1"), ("", "e1")]) == {
        ("", "e1"): replace(b, position=3)}
    assert [c.position for c in store.read_composer(0)] == [3, 4]
    assert store.append_composer([mark]) == 5


def test_the_newest_checkpoints_are_kept_newest_first(store: Store) -> None:
    assert store.checkpoints() == []
    numbers = [store.put_checkpoint(f"c{i}".encode(), keep=2) for i in range(4)]
    assert numbers == sorted(numbers) and len(set(numbers)) == 4
    assert store.checkpoints() == [(numbers[3], b"c3"), (numbers[2], b"c2")]


def test_a_subscription_keeps_its_link_starts(store: Store) -> None:
    record = replace(subscription(), links='{"traffic": 4}')
    store.put_subscription(record)
    assert store.subscription("ann", "P1") == record


def test_the_dead_letter_log_keeps_each_letter_in_order_filters_marks_and_trims(
        store: Store) -> None:
    """Every refused input is kept with its reason, source, client, place and raw bytes
    (mediator/dead_letters.py); read oldest first, by reason, source or client; a republish is
    noted; retention keeps the newest and positions are never given again."""
    assert store.dead_letter_bounds() == (0, 0)
    letters = [DeadLetterRecord("late", "publish", "event time … is behind", 10, client="ann",
                                where="event 3", event_id="e3", raw=b'{"id": "e3"}', size=12),
               DeadLetterRecord("payload", "plant", "not JSON", 11, where="plant/l1/temp",
                                raw=b"\xff\x00", size=2, kind="payload"),
               DeadLetterRecord("late", "svc", "reported after …", 12, kind="report")]
    assert store.append_dead_letters(letters) == 3
    assert store.append_dead_letters([replace(letters[0], client="bob", time_us=13)]) == 4
    read = store.read_dead_letters(0)
    assert [(r.position, r.reason, r.source, r.client) for r in read] == [
        (1, "late", "publish", "ann"), (2, "payload", "plant", ""), (3, "late", "svc", ""),
        (4, "late", "publish", "bob")]
    assert read[1] == replace(letters[1], position=2) and read[1].raw == b"\xff\x00"
    assert [r.position for r in store.read_dead_letters(0, reason="late")] == [1, 3, 4]
    assert [r.position for r in store.read_dead_letters(0, source="publish", client="bob")] == [4]
    assert [r.position for r in store.read_dead_letters(1, limit=2)] == [2, 3]
    assert store.mark_republished(2, 99) and not store.mark_republished(9, 99)
    assert store.read_dead_letters(1, limit=1)[0].republished_us == 99
    assert store.trim_dead_letters(2) == 2
    assert store.dead_letter_bounds() == (3, 4)
    assert [r.position for r in store.read_dead_letters(0)] == [3, 4]
    assert store.append_dead_letters([letters[2]]) == 5


def test_clients_are_stored_found_by_token_hash_and_replaced(store: Store) -> None:
    ann = ClientRecord("ann", "h1", 5)
    store.put_client(ann)
    store.put_client(ClientRecord("bob", "h2", 6))
    assert store.client("ann") == ann and store.client("nobody") is None
    assert store.client_by_token_hash("h1") == ann and store.client_by_token_hash("h9") is None
    assert [c.name for c in store.clients()] == ["ann", "bob"]
    renewed = ClientRecord("ann", "h3", 7, revoked=True)
    store.put_client(renewed)
    assert store.client("ann") == renewed
    assert store.client_by_token_hash("h1") is None           # the old token finds nothing
    assert store.client_by_token_hash("h3") == renewed


def test_subscriptions_are_stored_listed_and_updated_without_losing_their_log(
        store: Store) -> None:
    odd = SubscriptionRecord("a:b/c", "x:y%z", "profile Q: A", 2, 7, 123, "")
    store.put_subscription(subscription())
    store.put_subscription(subscription("bob", "P1"))
    store.put_subscription(odd)
    assert store.subscription("a:b/c", "x:y%z") == odd
    assert store.subscription("a", "b/c:x:y%z") is None
    assert store.subscriptions() == [odd, subscription(), subscription("bob", "P1")]
    assert store.subscriptions("ann") == [subscription()] and store.subscriptions("eve") == []
    store.append_notifications("ann", "P1", items("a", "b"))
    store.put_subscription(subscription(start=9))             # replanned: the log stays
    assert store.subscription("ann", "P1") == subscription(start=9)
    assert positions(store) == [1, 2]


def test_count_subscriptions_counts_each_owners_once_and_follows_deletes(store: Store) -> None:
    assert store.count_subscriptions("ann") == 0
    for name in ("P1", "P2", "a:b%c"):
        store.put_subscription(subscription("ann", name))
    store.put_subscription(subscription("ann", "P1", start=5))   # replaced: counted once
    store.put_subscription(subscription("a:b", "P1"))            # another owner, a ':' in it
    assert store.count_subscriptions("ann") == 3 == len(store.subscriptions("ann"))
    assert store.count_subscriptions("a:b") == 1 and store.count_subscriptions("a") == 0
    assert store.delete_subscription("ann", "a:b%c") and not store.delete_subscription("ann", "x")
    assert store.count_subscriptions("ann") == 2
    assert [r.name for r in store.subscriptions("ann")] == ["P1", "P2"]


def test_sqlite_counts_the_subscriptions_of_a_file_written_before_the_counts(
        tmp_path: Path) -> None:
    """A file whose layout predates the counts table gets it (filled) when opened."""
    store = SqliteStore(tmp_path / "old.db")
    for owner, name in (("ann", "P1"), ("ann", "P2"), ("bob", "P1")):
        store.put_subscription(subscription(owner, name))
    store.close()
    db = sqlite3.connect(tmp_path / "old.db")
    db.executescript("DROP TRIGGER owners_in; DROP TRIGGER owners_out; DROP TABLE owners;")
    db.close()
    store = SqliteStore(tmp_path / "old.db")
    assert store.count_subscriptions("ann") == 2 and store.count_subscriptions("bob") == 1
    store.put_subscription(subscription("bob", "P2"))
    assert store.count_subscriptions("bob") == 2
    store.close()


def test_redis_counts_the_subscriptions_of_a_store_written_before_the_counts(
        redis_url: str) -> None:
    """A store whose layout predates the per-owner sets gets them when opened."""
    store = RedisStore(redis_url)
    for owner, name in (("ann", "P1"), ("ann", "P2"), ("b:o", "x:y")):
        store.put_subscription(subscription(owner, name))
    raw = redis.Redis.from_url(redis_url)
    raw.delete(*raw.keys("evamed:owned:*"))
    raw.hdel("evamed:meta", "store.owners-indexed")
    store.close()
    store = RedisStore(redis_url)
    assert store.count_subscriptions("ann") == 2 and store.count_subscriptions("b:o") == 1
    assert [r.name for r in store.subscriptions("b:o")] == ["x:y"]
    store.close()
    raw.close()


def test_delete_subscription_removes_its_log_and_its_ids(store: Store) -> None:
    store.put_subscription(subscription())
    store.put_subscription(subscription("bob"))
    store.append_notifications("ann", "P1", items("a", "b"))
    store.append_notifications("bob", "P1", items("a"))
    assert store.delete_subscription("ann", "P1") is True
    assert store.delete_subscription("ann", "P1") is False
    assert store.subscription("ann", "P1") is None
    assert store.read_notifications("ann", "P1", 0) == []
    assert store.notification_bounds("ann", "P1") == (0, 0)
    assert positions(store, "bob") == [1]                       # the other log is untouched
    store.put_subscription(subscription())                      # added again: a new log
    assert [(n.position, n.composite_id)
            for n in store.append_notifications("ann", "P1", items("a"))] == [(1, "a")]


def test_meta_values_are_kept_and_replaced(store: Store) -> None:
    assert store.get_meta("newest") is None
    store.set_meta("newest", "17")
    store.set_meta("newest", "18")
    assert store.get_meta("newest") == "18"


# -- threads and processes


def test_two_threads_appending_get_unique_increasing_positions_and_lose_nothing(
        store: Store) -> None:
    store.put_subscription(subscription())
    heads: dict[str, list[int]] = {"t0": [], "t1": []}
    logged: dict[str, list[int]] = {"t0": [], "t1": []}

    def work(tag: str) -> None:
        for k in range(40):
            heads[tag].append(store.append_events([f"{tag}-{k}-{i}" for i in range(10)]))
            logged[tag] += [n.position for n in store.append_notifications(
                "ann", "P1", items(f"{tag}-{k}", f"{tag}-{k}", "shared"))]

    threads = [threading.Thread(target=work, args=(tag,)) for tag in heads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    events = store.read_events(0, limit=10_000)
    assert [e.position for e in events] == list(range(1, 801))
    for tag in heads:
        mine = [e.line for e in events if e.line.startswith(tag)]
        assert mine == [f"{tag}-{k}-{i}" for k in range(40) for i in range(10)]
        assert heads[tag] == sorted(set(heads[tag]))
        assert logged[tag] == sorted(set(logged[tag]))
    notes = store.read_notifications("ann", "P1", 0)
    assert [n.position for n in notes] == list(range(1, 82))      # 2 x 40 + "shared" once
    assert sorted(logged["t0"] + logged["t1"]) == list(range(1, 82))


_APPENDER = """
import sys
from mediator.store.sqlite import SqliteStore
store = SqliteStore(sys.argv[1])
batch = 0
while True:
    batch += 1
    print(store.append_events([f"b{batch}-{i}" for i in range(50)]), flush=True)
"""


def test_sqlite_keeps_every_acknowledged_append_when_the_process_is_killed(
        tmp_path: Path) -> None:
    """WAL with synchronous=NORMAL: a commit is in the OS when append_events returns."""
    path = tmp_path / "store.db"
    child = subprocess.Popen([sys.executable, "-c", _APPENDER, str(path)], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    acknowledged = [int(child.stdout.readline()) for _ in range(30)]
    os.kill(child.pid, signal.SIGKILL)                    # mid-way through the next append
    child.wait(timeout=10)
    reopened = SqliteStore(path)
    events = reopened.read_events(0, limit=100_000)
    assert reopened.event_head() >= acknowledged[-1] == 1500
    assert [e.position for e in events] == list(range(1, reopened.event_head() + 1))
    assert events[1499].line == "b30-49"
    reopened.close()


def test_redis_with_aof_keeps_every_acknowledged_append_when_the_server_is_killed(
        tmp_path: Path) -> None:
    server = RedisServer(tmp_path, appendonly=True)
    try:
        store = RedisStore(server.url)
        store.put_subscription(subscription())
        for batch in range(20):
            store.append_events([f"b{batch}-{i}" for i in range(50)])
            store.append_notifications("ann", "P1", items(f"n{batch}"))
        store.close()
        server.kill()
        server.start()
        reopened = RedisStore(server.url)
        assert reopened.event_head() == 1000
        assert len(reopened.read_events(0, limit=5000)) == 1000
        assert positions(reopened) == list(range(1, 21))
        assert reopened.append_notifications("ann", "P1", items("n3")) == []
        reopened.close()
    finally:
        server.stop()


# -- one store only


def test_redis_stores_under_different_prefixes_are_apart(redis_url: str) -> None:
    one, two = RedisStore(redis_url), RedisStore(f"{redis_url}/0?prefix=other:")
    one.append_events(["a", "b"])
    assert two.event_head() == 0 and two.append_events(["c"]) == 1
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert {str(key).split(":")[0] for key in client.keys("*")} == {"evamed", "other"}
    client.close()
    one.close()
    two.close()


def test_a_store_of_a_newer_schema_is_refused(tmp_path: Path, redis_url: str) -> None:
    path = tmp_path / "store.db"
    SqliteStore(path).close()
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    db.close()
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}; this evamed"):
        SqliteStore(path)
    redis.Redis.from_url(redis_url).set("evamed:schema", SCHEMA_VERSION + 1)
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}; this evamed"):
        RedisStore(redis_url)


def test_a_store_that_cannot_be_opened_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"cannot open the SQLite store .*missing/store\.db"):
        SqliteStore(tmp_path / "missing" / "store.db")
    (tmp_path / "junk.db").write_bytes(b"not a database, " * 100)
    with pytest.raises(StoreError, match=r"junk\.db"):
        SqliteStore(tmp_path / "junk.db")
    with pytest.raises(StoreError, match=r"cannot open the Redis store at 127\.0\.0\.1:\d+/0") as no:
        RedisStore(f"redis://:secret@127.0.0.1:{free_port()}/0?socket_connect_timeout=1")
    assert "secret" not in str(no.value)


# -- URLs


def test_open_store_reads_each_url_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        redis_url: str) -> None:
    monkeypatch.chdir(tmp_path)
    for url, path in [(f"sqlite://{tmp_path}/abs.db", tmp_path / "abs.db"),
                      ("sqlite://rel.db", tmp_path / "rel.db"),
                      ("bare.db", tmp_path / "bare.db"),
                      ("sqlite://full.db?synchronous=FULL", tmp_path / "full.db")]:
        opened = open_store(url)
        assert isinstance(opened, SqliteStore) and Path(opened.path).resolve() == path
        opened.close()
    assert parse_store_url("sqlite://x.db?synchronous=full").synchronous == "FULL"
    remote = open_store(f"{redis_url}/2?prefix=mine:")
    assert isinstance(remote, RedisStore) and remote.prefix == "mine:"
    remote.close()


@pytest.mark.parametrize(("url", "message"), [
    ("", "the store URL is empty"),
    ("localhost:6379", "looks like a URL without '//'"),
    ("postgres://db/x", "'postgres':// is not a store scheme; expected sqlite:///abs/path.db"),
    ("sqlite://", "names no SQLite file"),
    ("sqlite:///tmp/", "names no SQLite file"),
    ("sqlite://x.db?journal=off", "takes only ?synchronous=normal"),
    ("redis://", "names no host"),
    ("redis://h:port/0", "bad Redis store URL"),
    ("redis://h:6379/zero", "the Redis database is a number, got 'zero'"),
    ("redis://h/0?prefix=", "key prefix"),
    ("redis://h/0?colour=red", "unknown Redis store URL parameter colour"),
    ("redis://h/0?db=x", "Invalid value for 'db'"),
])
def test_a_bad_store_url_is_a_value_error_saying_what_is_expected(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("?", r"\?").replace(".", r"\.")):
        open_store(url)


_PREFIXES = ["", "sqlite://", "sqlite:///", "redis://", "rediss://", "REDIS://", "redis:",
             "http://", "redis://h:", "redis://h/", "redis://h:1/0?", "/tmp/"]


@settings(max_examples=2000, deadline=None)
@given(st.one_of(
    st.text(max_size=40),
    st.builds(str.__add__, st.sampled_from(_PREFIXES), st.text(max_size=30)),
    st.builds(str.__add__, st.sampled_from(_PREFIXES),
              st.text(alphabet="[]:@/?&=%.-0123456789abhz", max_size=30))))
def test_store_urls_parse_to_a_store_or_a_value_error(url: str) -> None:
    """Fuzz: what open_store does before it touches a file or a server (for Redis, up to and
    including redis-py's own reading of the URL)."""
    try:
        parsed = parse_store_url(url)
    except ValueError:
        return
    assert parsed.kind in ("sqlite", "redis") and parsed.target
    if parsed.kind == "redis":
        redis.Redis.from_url(redis_options(parsed.target)[0]).close()  # no ValueError left
