"""Fuzzed calls of both gRPC APIs against real servers: ``python -m fuzz.calls --calls 10000``.

Starts ``evamed serve`` (SQLite in a temporary directory, two registered clients, one of them an
operator) and one ``evamed base-service`` per language group, then calls every method of
eva.mediator.v1 and eva.base.v1 with requests built from the methods' descriptors — fields from
pools of valid and hostile values (names, profiles, queries, CloudEvents, huge and non-UTF-8
strings, edge integers, unknown enum numbers) — and, for a third of them, the serialised bytes
mutated (bit flips, cuts, insertions, random bytes), with a valid token, a wrong one or none.

What must hold (issue 28): every call ends with a status other than UNKNOWN and INTERNAL (or
streams until the campaign cancels it), no server writes a traceback, and every server still
answers health at the end. The counts per API and status go to build/fuzz/calls.json."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor as pb_descriptor  # type: ignore[import-untyped]
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adapters._proto import base_pb2
from mediator.wire import mediator_pb2

ROOT = Path(__file__).resolve().parent.parent
EVAMED = str(Path(sys.executable).with_name("evamed"))
GROUPS = ("cg1", "cg2", "cg3", "cg4", "cg5")
BAD = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL})

PROFILE = ('class A = type == "a"\nclass B = type == "b" and data.k > 1\n'
           "profile P = ((all_dup(A); last_dup(B))_10s)_all_pairs\n")
EVENT = json.dumps({"specversion": "1.0", "id": "e1", "source": "fuzz", "type": "a",
                    "time": "2026-03-02T10:00:00Z", "data": {"k": 2}})
QUERIES = {"cg1": '[type = "a"]', "cg2": "a ; b CONTEXT recent",
           "cg3": "SELECT x.id FROM a AS x", "cg4": 'a -> b', "cg5": "a ; b"}
STRINGS = ["", "P", "alice", "fuzz", "a", "b", "cg1", "traffic", "*", "..", "x" * 7000,
           "\u202e\u0000", "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
           PROFILE, PROFILE * 50, "profile P = " + "(" * 5000, EVENT, EVENT[:30], "2026-03-02T10:00:00Z",
           *QUERIES.values(), "SELECT" + " " * 100_000]
INTEGERS = [0, 1, -1, 2, 7, 1 << 31, (1 << 63) - 1, -(1 << 63), 1_700_000_000_000_000]


class Server:
    """A started ``evamed`` server process that prints "serving … on HOST:PORT"."""

    def __init__(self, *args: str, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen([EVAMED, *args], stdout=subprocess.PIPE,
                                     stderr=log.open("wb"), text=True, cwd=ROOT)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("serving "):
            self.stop()
            raise SystemExit(f"evamed {' '.join(args[:3])} did not start: {line}"
                             f"{log.read_text(errors='replace')[-2000:]}")
        self.address = line.split()[-1]

    def healthy(self) -> bool:
        with grpc.insecure_channel(self.address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=5)
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def tracebacks(self) -> int:
        return self.log.read_text(errors="replace").count("Traceback")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def value(field: pb_descriptor.FieldDescriptor, rng: random.Random, depth: int) -> Any:
    kind = field.type
    if kind == field.TYPE_MESSAGE:
        return request(field.message_type, rng, depth + 1)
    if kind == field.TYPE_STRING:
        return rng.choice(STRINGS) if rng.random() < 0.8 else "".join(
            chr(rng.randrange(0x20, 0x2FFF)) for _ in range(rng.randrange(40)))
    if kind == field.TYPE_BYTES:
        return rng.choice(STRINGS).encode() if rng.random() < 0.7 else rng.randbytes(
            rng.randrange(64))
    if kind == field.TYPE_BOOL:
        return rng.random() < 0.5
    if kind in (field.TYPE_DOUBLE, field.TYPE_FLOAT):
        return rng.choice([0.0, -1.5, 1e308, float("inf"), float("nan"), 0.25])
    if kind == field.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values]
        return rng.choice(numbers) if rng.random() < 0.8 else rng.randrange(-5, 100)
    unsigned = kind in (field.TYPE_UINT32, field.TYPE_UINT64, field.TYPE_FIXED32,
                        field.TYPE_FIXED64)
    bits = 32 if kind in (field.TYPE_INT32, field.TYPE_UINT32, field.TYPE_SINT32,
                          field.TYPE_FIXED32, field.TYPE_SFIXED32) else 64
    number = rng.choice(INTEGERS)
    low, high = (0, (1 << bits) - 1) if unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return min(max(number, low), high)


def request(desc: pb_descriptor.Descriptor, rng: random.Random, depth: int = 0) -> Any:
    """A message of ``desc`` with random fields set (nested messages to depth 3)."""
    message = message_factory.GetMessageClass(desc)()
    for field in desc.fields:
        if rng.random() < 0.35 or (field.type == field.TYPE_MESSAGE and depth >= 3):
            continue
        if field.is_repeated:
            for _ in range(rng.choice([0, 1, 1, 2, 5])):
                item = value(field, rng, depth)
                if field.type == field.TYPE_MESSAGE:
                    getattr(message, field.name).add().CopyFrom(item)
                else:
                    getattr(message, field.name).append(item)
        elif field.type == field.TYPE_MESSAGE:
            getattr(message, field.name).CopyFrom(value(field, rng, depth))
        else:
            with contextlib.suppress(ValueError, TypeError):  # a value the type refuses: unset
                setattr(message, field.name, value(field, rng, depth))
    return message


def mutated(data: bytes, rng: random.Random) -> bytes:
    for _ in range(rng.randrange(1, 4)):
        edit = rng.randrange(4)
        at = rng.randrange(len(data) + 1)
        if edit == 0 and data:
            i = rng.randrange(len(data))
            data = data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]
        elif edit == 1:
            data = data[:at]
        elif edit == 2:
            data = data[:at] + rng.randbytes(rng.randrange(1, 9)) + data[at:]
        else:
            data = rng.randbytes(rng.randrange(40))
    return data


def body(desc: pb_descriptor.Descriptor, rng: random.Random) -> bytes:
    data: bytes = request(desc, rng).SerializeToString()
    return mutated(data, rng) if rng.random() < 0.33 else data


def call(channel: grpc.Channel, service: str, method: pb_descriptor.MethodDescriptor,
         rng: random.Random, metadata: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    """One call: its status's name ("OK", or "STREAMING" for a stream still open when cut) and
    the status's message."""
    path = f"/{service}/{method.name}"
    plain = {"request_serializer": None, "response_deserializer": None}
    try:
        if method.client_streaming:
            messages = [body(method.input_type, rng) for _ in range(rng.randrange(1, 4))]
            if method.server_streaming:
                stream = channel.stream_stream(path, **plain)(iter(messages), timeout=2,
                                                              metadata=metadata)
                return _drain(stream), ""
            channel.stream_unary(path, **plain)(iter(messages), timeout=5, metadata=metadata)
        elif method.server_streaming:
            return _drain(channel.unary_stream(path, **plain)(
                body(method.input_type, rng), timeout=2, metadata=metadata)), ""
        else:
            channel.unary_unary(path, **plain)(body(method.input_type, rng), timeout=5,
                                               metadata=metadata)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and method.server_streaming:
            return "STREAMING", ""
        return str(code.name), str(exc.details())[:300]
    return "OK", ""


def _drain(stream: Iterator[bytes]) -> str:
    """A stream read to its end or until three messages came (then cancelled)."""
    for count, _ in enumerate(stream):
        if count >= 2:
            stream.cancel()  # type: ignore[attr-defined]
            return "STREAMING"
    return "OK"


def campaign(calls: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="evamed-fuzz-calls-"))
    config = work / "mediator.toml"
    config.write_text(f'listen = "127.0.0.1:0"\nstore = "sqlite:///{work}/m.db"\n'
                      'composer = "inprocess"\n[limits]\nrate = 0\n')
    tokens = [subprocess.run([EVAMED, "clients", "add", name, *extra, "--config", str(config)],
                             capture_output=True, text=True, check=True).stdout.strip()
              for name, extra in (("fuzz", []), ("op", ["--operator"]))]
    servers: dict[str, Server] = {}
    counts: dict[str, Counter[str]] = {"mediator": Counter(), "base": Counter()}
    bad: list[str] = []  # the first few calls with a status that is a finding
    started = time.monotonic()
    try:
        servers["mediator"] = Server("serve", "--config", str(config), log=work / "mediator.log")
        for group in GROUPS:
            servers[group] = Server("base-service", "--group", group, "--listen", "127.0.0.1:0",
                                    log=work / f"{group}.log")
        apis = [("mediator", mediator_pb2.DESCRIPTOR.services_by_name["MediatorService"]),
                ("base", base_pb2.DESCRIPTOR.services_by_name["BaseService"])]
        channels = {name: grpc.insecure_channel(s.address) for name, s in servers.items()}
        for n in range(calls * 2):
            api, service = apis[n % 2]
            name = "mediator" if api == "mediator" else GROUPS[(n // 2) % len(GROUPS)]
            method = rng.choice(service.methods)
            token = rng.choice([*tokens, *tokens, *tokens, "wrong", ""])
            metadata = (("authorization", f"Bearer {token}"),) if token else ()
            status, details = call(channels[name], service.full_name, method, rng, metadata)
            counts[api][status] += 1
            if status in {s.name for s in BAD} and len(bad) < 20:
                bad.append(f"{name} {method.name}: {status} {details}")
            if n % 2000 == 1999:
                print(f"{n + 1:>7} calls: " + "; ".join(f"{a} {dict(c.most_common(6))}"
                                                     for a, c in counts.items()), flush=True)
        healthy = {name: s.healthy() for name, s in servers.items()}
        for channel in channels.values():
            channel.close()
    finally:
        for s in servers.values():
            s.stop()
    report = {"calls": {api: sum(c.values()) for api, c in counts.items()},
              "statuses": {api: dict(c) for api, c in counts.items()},
              "bad": {api: sum(c[s.name] for s in BAD) for api, c in counts.items()},
              "tracebacks": {name: s.tracebacks() for name, s in servers.items()},
              "healthy at the end": healthy, "examples": bad, "seconds": round(time.monotonic() - started),
              "logs": str(work)}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10_000, help="per API")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    os.chdir(ROOT)
    report = campaign(args.calls, args.seed)
    out = ROOT / "build" / "fuzz"
    out.mkdir(parents=True, exist_ok=True)
    (out / "calls.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    failed = (any(report["bad"].values()) or any(report["tracebacks"].values())
              or not all(report["healthy at the end"].values()))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
