"""Delivery keeps up or says so (issue 29, item 3): a burst larger than the retention, read
by an active subscriber through a real mediator whose `limits.rate` alone would keep the
reader behind what the log keeps — every composite arrives, none is trimmed from under it."""

from __future__ import annotations

import json
import time
from pathlib import Path

from eva.events import format_time
from mediator.client import MediatorClient
from mediator.config import Config, Limits
from mediator.security import add_client
from mediator.server import serve
from mediator.store.sqlite import SqliteStore
from tests.helpers import Reader


def test_a_burst_beyond_the_retention_reaches_a_reading_subscriber_whole(tmp_path: Path) -> None:
    """3,000 composites in 3 s, retention 2,000, rate 100/s: paced, the reader would need 30 s
    and fall behind what the log keeps after about two (OUT_OF_RANGE); the pace yields half
    the retention behind the head, so it receives all 3,000, in order."""
    store = SqliteStore(tmp_path / "m.db")
    token = add_client(store, "ops", operator=True)
    running = serve(Config(listen="127.0.0.1:0", retention=2_000, lateness=0,
                           limits=Limits(rate=100)), store=store)
    try:
        with MediatorClient(f"127.0.0.1:{running.port}", token) as client:
            client.add_profile('class R = type == "r"\nprofile Each = R\n', name="each")
            reader = Reader(client.subscribe(name="each"))
            start = time.time_ns() // 1000 - 10_000_000
            events = [json.dumps({"specversion": "1.0", "id": f"e{i}", "source": "ops",
                                  "type": "r", "time": format_time(start + i)})
                      for i in range(3_000)]
            for at in range(0, 3_000, 100):  # ~1,000/s: what a reader keeps up with
                assert client.publish(events[at:at + 100],
                                      advance_to=start + at + 99).accepted == 100
                time.sleep(0.1)
            got = reader.wait_for(3_000, 120)
            assert [n.cloudevent["data"]["constituents"][0] for n in got] == [
                f"e{i}" for i in range(3_000)]
    finally:
        running.stop(1.0)
        store.close()
