"""Real servers for tests: a redis-server and a mosquitto (Debian's) on free loopback ports.

The fixtures that use them live in tests/conftest.py (``redis_server``, ``redis_url``,
``mosquitto``)."""

from __future__ import annotations

import getpass
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


class MosquittoServer:
    """A mosquitto with its own config file, log and persistence directory in ``directory``.
    Persistence is on and saved after every change (``autosave_on_changes``, interval 1), so a
    broker killed and started again still holds the persistent sessions and the QoS-1 messages
    it had queued for them — as much as mosquitto's persistence keeps (docs/sources.md).
    ``users``: name → password; then anonymous clients are refused. ``tls``: the listener
    speaks TLS only, with a server certificate for 127.0.0.1 signed by a CA made for the test
    (``ca_file``; openssl makes both)."""

    def __init__(self, directory: Path, *, users: dict[str, str] | None = None,
                 tls: bool = False) -> None:
        binary = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin")
        if binary is None:
            pytest.fail("mosquitto is not installed (make test installs it)")
        self.port = free_port()
        self.directory = directory / f"mosquitto-{self.port}"
        self.directory.mkdir(parents=True)
        self.log = self.directory / "mosquitto.log"
        lines = [
            f"listener {self.port} 127.0.0.1",
            # Started as root, mosquitto would switch to its own user, who cannot write here.
            f"user {getpass.getuser()}",
            "persistence true",
            f"persistence_location {self.directory}/",
            "autosave_on_changes true",
            "autosave_interval 1",
            "max_queued_messages 100000",  # what waits for an offline persistent session
            "set_tcp_nodelay true",
            f"log_dest file {self.log}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
        ]
        if tls:
            self.ca_file = str(self._certificates())
            lines += [f"cafile {self.ca_file}", f"certfile {self.directory / 'server.crt'}",
                      f"keyfile {self.directory / 'server.key'}"]
        if users:
            passwords = self.directory / "passwords"
            passwords.write_text("".join(f"{u}:{p}\n" for u, p in users.items()))
            passwords.chmod(0o600)
            # Hashes the plain file in place (mosquitto_passwd -U), as an operator would.
            tool = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
            subprocess.run([tool, "-U", str(passwords)], check=True)
            lines += ["allow_anonymous false", f"password_file {passwords}"]
        else:
            lines.append("allow_anonymous true")
        self.config = self.directory / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")
        self._argv = [binary, "-c", str(self.config)]
        self._proc: subprocess.Popen[bytes] | None = None
        self.start()

    def _certificates(self) -> Path:
        """A CA and a server certificate it signs (for 127.0.0.1 and localhost), valid 2 days."""
        ca = self.directory / "ca.crt"

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                            "-days", "2", *args], check=True, capture_output=True)

        openssl("-keyout", str(self.directory / "ca.key"), "-out", str(ca), "-subj",
                "/CN=evamed test CA")
        openssl("-CA", str(ca), "-CAkey", str(self.directory / "ca.key"),
                "-keyout", str(self.directory / "server.key"),
                "-out", str(self.directory / "server.crt"), "-subj", "/CN=localhost",
                "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1")
        return ca

    def start(self) -> None:
        """Start (again, on the same port and files) and wait until it accepts connections."""
        self._proc = subprocess.Popen(self._argv, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        for _ in range(200):
            if self._proc.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        log = self.log.read_text() if self.log.exists() else ""
        pytest.fail(f"mosquitto on port {self.port} did not accept connections within 10 s:\n"
                    f"{log[-2000:]}")

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self._proc = None

    def restart(self, down: float = 0.0) -> None:
        """Kill, stay down ``down`` seconds, start again."""
        self.kill()
        time.sleep(down)
        self.start()

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
            self._proc = None
