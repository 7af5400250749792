"""Faults are statuses (issue 29, item 5): a real redis-server as the store, SIGKILLed under a
running mediator and started again — every call answers UNAVAILABLE (never UNKNOWN) and
health is NOT_SERVING until the store answers, then SERVING, and the pipeline goes on; long
names are cut in messages, so a refusal arrives as itself, not as RESOURCE_EXHAUSTED."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from eva.events import format_time
from mediator.client import MediatorClient, MediatorError
from mediator.config import Config, Limits
from mediator.security import add_client
from mediator.server import serve
from mediator.store import open_store
from mediator.store.sqlite import SqliteStore
from tests.helpers import Reader
from tests.servers import RedisServer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def reading(ident: str) -> str:
    return json.dumps({"specversion": "1.0", "id": ident, "source": "s", "type": "reading",
                       "time": format_time(time.time_ns() // 1000)})


def until(what: str, check: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.05)


def test_a_store_that_is_down_is_unavailable_and_not_serving_until_it_returns(
        tmp_path: Path) -> None:
    redis_server = RedisServer(tmp_path, appendonly=True)
    url = redis_server.url + "/0"
    store = open_store(url)
    token = add_client(store, "ops", operator=True)
    running = serve(Config(listen="127.0.0.1:0", store=url, lateness=0), store=store)
    address = f"127.0.0.1:{running.port}"
    channel = grpc.insecure_channel(address)
    health = health_pb2_grpc.HealthStub(channel)

    def status() -> Any:
        return health.Check(health_pb2.HealthCheckRequest(service="")).status

    client = MediatorClient(address, token)
    try:
        client.add_profile('class R = type == "reading"\nprofile Each = R\n', name="each")
        reader = Reader(client.subscribe(name="each"))
        assert client.publish([reading("before")], advance_to=time.time_ns() // 1000).accepted == 1
        reader.wait_for(1)
        assert status() == SERVING

        redis_server.kill()
        calls: dict[str, Callable[[], Any]] = {
            "Publish": lambda: client.publish([reading("during")]),
            "ListProfiles": client.profiles,
            "GetProfile": lambda: client.profile("each"),
            "AddProfile": lambda: client.add_profile("class R = type == \"r\"\n"
                                                     "profile P = R\n", name="other"),
            "ListDeadLetters": lambda: list(client.dead_letters()),
        }
        for name, call in calls.items():
            with pytest.raises(MediatorError) as refused:
                call()
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE, (name, refused.value)
            assert "cannot reach its store" in str(refused.value), (name, refused.value)
        until("health NOT_SERVING", lambda: status() == NOT_SERVING)

        redis_server.start()
        until("health SERVING again", lambda: status() == SERVING)
        assert client.publish([reading("after")], advance_to=time.time_ns() // 1000
                              ).accepted == 1
        got = reader.wait_for(2) if reader.error is None else None
        if got is None:  # the stream ended with the outage: resume, as a client does
            got = list(Reader(client.subscribe(name="each")).wait_for(2))
        assert [n.cloudevent["data"]["constituents"] for n in got][-1] == ["after"]
        assert running.served.pipeline.error is None
    finally:
        client.close()
        channel.close()
        running.stop(1.0)
        store.close()
        redis_server.stop()


def test_a_long_name_is_cut_so_the_refusal_arrives_as_itself(tmp_path: Path) -> None:
    """A profile name of 20,000 characters over the time-frame limit, a class of 20,000
    characters not defined: INVALID_ARGUMENT with the name cut, never RESOURCE_EXHAUSTED."""
    store = SqliteStore(tmp_path / "m.db")
    token = add_client(store, "alice")
    running = serve(Config(listen="127.0.0.1:0", limits=Limits(time_frame=60_000_000)),
                    store=store)
    long = "P" * 20_000
    try:
        with MediatorClient(f"127.0.0.1:{running.port}", token) as client:
            for text in (f'class R = type == "r"\nprofile {long} = ((all_dup(R), all_dup(R))_1h)_all_pairs\n',
                         f"profile P = ((all_dup(C{long}), all_dup(R))_1s)_all_pairs\n"):
                with pytest.raises(MediatorError) as refused:
                    client.add_profile(text, name="p")
                assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, refused.value
                assert len(refused.value.message) < 2_000
    finally:
        running.stop(1.0)
        store.close()
