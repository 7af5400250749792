"""Hypothesis profiles: CI runs are derandomized (reproducible); ``HYPOTHESIS_PROFILE=explore``
searches further with fresh randomness. Fixtures every test file may use: ``redis_server`` /
``redis_url``, a real redis-server; ``mosquitto``, a real MQTT broker (tests/servers.py). No
test reads or writes the user's saved tokens."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from eva import native
from tests.servers import MosquittoServer, RedisServer

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None, max_examples=2000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="session")
def _no_saved_tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tests (and the commands they start) never read or write the user's saved tokens
    (mediator/credentials.py): a file of their own, empty unless a test saves one."""
    given = os.environ.get("EVAMED_CREDENTIALS")
    os.environ["EVAMED_CREDENTIALS"] = str(tmp_path_factory.mktemp("credentials") / "none.toml")
    yield
    if given is None:
        os.environ.pop("EVAMED_CREDENTIALS", None)
    else:
        os.environ["EVAMED_CREDENTIALS"] = given


@pytest.fixture(autouse=True)
def _no_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command's output is as piped unless a test says otherwise: pytest-xdist's workers
    get COLUMNS=80 and LINES=24 in their environment, which the CLI takes for a terminal's
    width (mediator/cli/common.py out_console). A test that wants a width passes COLUMNS."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, no persistence; stopped after the test."""
    server = RedisServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[MosquittoServer]:
    """A real mosquitto on a free loopback port with persistence; stopped after the test."""
    server = MosquittoServer(tmp_path)
    yield server
    server.stop()


def pytest_report_header() -> str:
    return f"evamed engine modules compiled with mypyc: {', '.join(native.compiled()) or 'none'}"


if native.stale():
    pytest.exit(f"compiled modules older than their source: {', '.join(native.stale())}; "
                "run `make native`", returncode=2)
