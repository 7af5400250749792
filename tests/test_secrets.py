"""Secrets never leak (issue 29, item 4): a token sent with a separator gRPC cannot decode is
logged by gRPC itself — the log handler redacts it in every encoding tried; configuration
reprs and store-URL errors never show a password."""

from __future__ import annotations

import io
import logging
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mediator import logs
from mediator.config import Config, load
from mediator.security import add_client
from mediator.server import serve
from mediator.store.sqlite import SqliteStore

ROOT = Path(__file__).resolve().parents[1]
EVAMED = str(Path(sys.executable).with_name("evamed"))
TOKEN = "evm_" + "Ab1-_" * 8
SEPARATORS = [" ", "\t", "\xa0", "\u2003", "\\xa0", "\\xc2\\xa0", "\\u00a0", "%C2%A0",
              "&nbsp;", ":", "=", "\\t"]


@pytest.mark.parametrize("separator", SEPARATORS)
def test_a_bearer_token_is_redacted_whatever_separates_it(separator: str) -> None:
    for shown in (f"Bearer{separator}{TOKEN}", f"b'Bearer{separator}{TOKEN}'",
                  f"authorization: bearer{separator}not-an-evm-token-but-a-secret"):
        clean = logs.redact(f"Invalid encoding on {shown}")
        assert TOKEN not in clean and "secret" not in clean and "[redacted]" in clean, clean


def test_a_token_is_redacted_wherever_it_stands_and_passwords_in_any_url() -> None:
    assert logs.redact(f"x\\xa0{TOKEN}y") == "x\\xa0[redacted]"
    assert logs.redact(f"Â\xa0{TOKEN}") == "Â\xa0[redacted]"
    assert logs.redact("redis://:pa/ss@host:1/0 and rediss://u:p%2Fw@h/1") == (
        "redis://:[redacted]@host:1/0 and rediss://u:[redacted]@h/1")
    assert logs.redact("MqttSourceConfig(password='s3 cr3t', x=1)") == (
        "MqttSourceConfig(password=[redacted], x=1)")


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream) + payload


def raw_call(port: int, path: bytes, authorization: bytes) -> None:
    """A gRPC call over HTTP/2 frames written by hand, as a hostile client can send it:
    header bytes no gRPC client library would send (HPACK literals, no Huffman coding)."""
    def literal(name: bytes, value: bytes) -> bytes:
        assert len(name) < 127 and len(value) < 127
        return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value
    block = b"".join(literal(k, v) for k, v in [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
        (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
        (b"te", b"trailers"), (b"authorization", authorization)])
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"")
                  + frame(1, 4, 1, block) + frame(0, 1, 1, b"\x00\x00\x00\x00\x00"))
        try:
            while s.recv(65536):
                pass
        except TimeoutError:
            pass


@pytest.mark.parametrize("separator", [b"\xa0", b"\xc2\xa0", b"\xe9", b"\xff\xfe", b"\x7f"])
def test_a_real_token_behind_a_separator_grpc_cannot_decode_is_never_logged(
        tmp_path: Path, separator: bytes) -> None:
    """The header `Bearer<separator><a valid token>` (Latin-1 and UTF-8 bytes): gRPC logs the
    undecodable value at ERROR; what the mediator's log handler writes holds no token."""
    out = io.StringIO()
    logs.setup(stream=out)
    store = SqliteStore(tmp_path / "m.db")
    token = add_client(store, "alice")
    running = serve(Config(listen="127.0.0.1:0"), store=store)
    try:
        raw_call(running.port, b"/eva.mediator.v1.MediatorService/ListProfiles",
                 b"Bearer" + separator + token.encode())
    finally:
        running.stop(1.0)
        store.close()
        for handler in [h for h in logging.getLogger().handlers if h.get_name() == "evamed"]:
            logging.getLogger().removeHandler(handler)
    written = out.getvalue()
    assert token not in written and token[4:] not in written, written
    assert "serving" in written  # the handler did write the server's lines


def test_a_configurations_repr_shows_no_password(tmp_path: Path) -> None:
    path = tmp_path / "mediator.toml"
    path.write_text('store = "redis://:s3cr%2Fet@db:6379/0"\n\n[[sources]]\nname = "plant"\n'
                    'kind = "mqtt"\nusername = "u"\npassword = "br0ker-pw"\n\n'
                    '[[sources.rules]]\ntopic = "plant/+line/temp"\ntype = "plant.temp"\n\n'
                    '[[sources]]\nname = "cellar"\nkind = "redis"\n'
                    'url = "redis://:r3dis/pw@127.0.0.1:6379/0"\nstreams = ["c"]\n')
    config = load(path, environ={})
    shown = repr(config)
    assert "s3cr" not in shown and "br0ker-pw" not in shown and "r3dis" not in shown, shown
    assert "db:6379/0" in shown and "plant" in shown


@pytest.mark.parametrize("url", ["redis://:s3cr/et@host:1/0", "redis://:s3cr?et@host:1/0",
                                 "redis://u:s3cr#et@host/0", "redis://:s3cr@et@host:x/0"])
def test_a_store_url_that_does_not_parse_is_refused_without_its_password(
        tmp_path: Path, url: str) -> None:
    """`EVAMED_STORE=… evamed clients list`: one line saying what is wrong, no part of the
    password."""
    done = subprocess.run([EVAMED, "clients", "list"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "EVAMED_STORE": url,
                                                   "PYTHONPATH": str(ROOT)})
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "s3cr" not in done.stdout + done.stderr, done.stderr
    assert "error:" in done.stderr


def test_the_metrics_endpoint_takes_a_token_and_no_label_takes_an_event_source(
        tmp_path: Path) -> None:
    """With `metrics_token` the endpoint answers 401 without it; 2,000 events under 2,000
    sources (taken, refused as duplicates and as late) add no series per source."""
    import json
    import time
    import urllib.error
    import urllib.request

    from eva.events import format_time
    from mediator.client import MediatorClient
    from tests.servers import free_port

    store = SqliteStore(tmp_path / "m.db")
    token = add_client(store, "ops", operator=True)
    running = serve(Config(listen="127.0.0.1:0", metrics_port=free_port(),
                           metrics_token="m3trics-t0ken"), store=store)
    url = f"http://127.0.0.1:{running.metrics_port}/metrics"

    def scrape(header: str | None) -> str:
        request = urllib.request.Request(url, headers={"Authorization": header} if header else {})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return str(answer.read().decode())

    try:
        for header in (None, "Bearer wrong", f"Bearer\xa0{'m3trics-t0ken'}"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                scrape(header)
            assert refused.value.code == 401
        before = [ln for ln in scrape("Bearer m3trics-t0ken").splitlines()
                  if ln.startswith("evamed_")]
        now = time.time_ns() // 1000
        events = [json.dumps({"specversion": "1.0", "id": "x", "source": f"device-{n}",
                              "type": "t", "time": format_time(now - (n % 2) * 60_000_000)})
                  for n in range(2_000)]
        with MediatorClient(f"127.0.0.1:{running.port}", token) as client:
            reply = client.publish(events + events[:10])
        assert reply.accepted > 0 and reply.dead_lettered > 0
        after = [ln for ln in scrape("Bearer m3trics-t0ken").splitlines()
                 if ln.startswith("evamed_")]
        assert not any("device-" in ln for ln in after)
        assert len(after) <= len(before) + 10, len(after) - len(before)
    finally:
        running.stop(1.0)
        store.close()
