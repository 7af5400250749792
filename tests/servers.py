"""Real servers for tests: a redis-server (Debian's) on a free loopback port.

The fixtures that use it live in tests/conftest.py (``redis_server``, ``redis_url``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    """A redis-server with its files in ``directory``. ``appendonly=True``: AOF with
    ``appendfsync everysec``, as docs/operations.md recommends, so a server killed and started
    again keeps every acknowledged write; otherwise no persistence at all."""

    def __init__(self, directory: Path, *, appendonly: bool = False) -> None:
        server = shutil.which("redis-server")
        if server is None:
            pytest.fail("redis-server is not installed (make test installs it)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        persistence = (["--appendonly", "yes", "--appendfsync", "everysec"] if appendonly
                       else ["--appendonly", "no"])
        self._argv = [server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                      "--dir", str(directory), *persistence]
        self._proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        """Start (again, on the same port and files) and wait until it answers."""
        import redis

        self._proc = subprocess.Popen(self._argv, stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        try:
            for _ in range(200):
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()
        pytest.fail(f"redis-server on port {self.port} did not answer within 10 s")

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self._proc = None

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
            self._proc = None
