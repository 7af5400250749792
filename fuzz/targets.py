"""What the fuzz campaign feeds: every reader of outside bytes, each as one function of the
input's bytes that returns when the reader accepted or refused the input in its documented way
and raises anything else (the finding).

The properties are the ones the bounded fuzz tests check (tests/test_fuzz_*.py); here they run
coverage-guided for as long as the campaign is given (``make fuzz``, docs/operations.md).
Seeds are valid inputs of each reader, so mutation starts from the inside of the language."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], None]
    seeds: Callable[[], list[bytes]]


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


# ------------------------------------------------------------------ profiles

def profile(data: bytes) -> None:
    from tests.test_fuzz_profiles import check

    check(data, "fuzz")


def profile_seeds() -> list[bytes]:
    paths = [*ROOT.glob("examples/**/*.eva"), *ROOT.glob("docs/**/*.eva")]
    return [p.read_bytes() for p in paths][:50] or [b'class A = type == "a"\nprofile P = A\n']


# ------------------------------------------------------------------ native query languages

def native(group: str) -> Callable[[bytes], None]:
    def run(data: bytes) -> None:
        from adapters.backends.registry import language
        from tests.test_fuzz_native import accept_or_refuse

        accept_or_refuse(language(group), _text(data), Counter())

    return run


def native_seeds(group: str) -> Callable[[], list[bytes]]:
    def seeds() -> list[bytes]:
        from tests.test_fuzz_native import seeds as examples

        return [q.encode() for q in examples(group)]

    return seeds


# ------------------------------------------------------------------ events

def event(data: bytes) -> None:
    from tests.test_fuzz_events import decoded, through_the_engine

    if decoded(data) is not None:
        through_the_engine([data])


def event_seeds() -> list[bytes]:
    from tests.test_fuzz_events import GOOD

    day = (ROOT / "examples/logistics/sample.jsonl")
    lines = day.read_bytes().splitlines()[:20] if day.exists() else []
    return [json.dumps(GOOD).encode(), *lines]


# ------------------------------------------------------------------ the configuration

@cache
def _config_file() -> Path:
    return Path(tempfile.mkdtemp(prefix="evamed-fuzz-")) / "mediator.toml"


def config(data: bytes) -> None:
    from mediator.config import ConfigError, load

    path = _config_file()
    path.write_bytes(data)
    try:
        load(path, environ={})
    except ConfigError as exc:
        assert str(exc)


def config_seeds() -> list[bytes]:
    text = (ROOT / "docs/operations.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```toml\n")[1:]]
    return [b.encode() for b in blocks] or [b'listen = "127.0.0.1:0"\n']


# ------------------------------------------------------------------ MQTT and Redis messages

@cache
def _mapping() -> object:
    from adapters.mapping import parse_mapping

    return parse_mapping("plant", [
        {"topic": "plant/+line/+sensor/reading", "type": "plant.{sensor}.reading",
         "source": "mqtt://{broker}/{line}", "subject": "{sensor}",
         "time": {"field": "ts", "format": "epoch_ms"}, "id": {"field": "seq"}},
        {"topic": "alarms/#rest", "type": "plant.alarm", "subject": "{rest}",
         "non_json": "dead-letter"},
        {"topic": "raw/+", "type": "raw.{1}", "retained": "accept",
         "time": {"field": "at", "format": "rfc3339"}},
    ])


def message(data: bytes) -> None:
    """A broker message: the topic is the input up to the first NUL, the payload the rest."""
    from adapters.mapping import Mapped, Packet, SourceDeadLetter

    topic, _, payload = data.partition(b"\0")
    shown: str | bytes
    try:
        shown = topic.decode("utf-8")
    except UnicodeDecodeError:
        shown = topic
    result = _mapping().map(Packet(shown, payload, arrival_us=1_700_000_000_000_000))  # type: ignore[attr-defined]
    assert result is None or isinstance(result, Mapped | SourceDeadLetter), result


def message_seeds() -> list[bytes]:
    return [b"plant/l1/temp/reading\0" + json.dumps({"ts": 1_700_000_000_000, "seq": 3,
                                                     "v": 1.5}).encode(),
            b"alarms/a/b\0not json", b"raw/x\0" + json.dumps({"at": "2026-03-02T10:00:00Z"}).encode(),
            b"plant/l2/p/reading\0{\"ts\": 1e3, \"seq\": \"x\"}"]


def mapping_rules(data: bytes) -> None:
    """A source's mapping rules as the configuration gives them (JSON here)."""
    from adapters.mapping import MappingConfigError, parse_mapping

    try:
        rules = json.loads(data)
    except ValueError:
        return
    if not isinstance(rules, list):
        rules = [rules]
    try:
        parse_mapping("b", rules)
    except MappingConfigError as exc:
        assert str(exc)


def mapping_rules_seeds() -> list[bytes]:
    return [json.dumps([{"topic": "plant/+line/+sensor/reading", "type": "plant.{sensor}",
                         "source": "mqtt://{broker}/{line}", "subject": "{sensor}",
                         "time": {"field": "ts", "format": "epoch_ms"}, "id": {"field": "seq"}}]
                       ).encode(),
            json.dumps({"topic": "alarms/#rest", "type": "a", "non_json": "dead-letter"}).encode()]


# ------------------------------------------------------------------ state read back

def checkpoint(data: bytes) -> None:
    from mediator.checkpoints import CheckpointError, read

    try:
        read(data)
    except CheckpointError as exc:
        assert str(exc)


def checkpoint_seeds() -> list[bytes]:
    from mediator.checkpoints import write

    return [write({"own": {"position": 3, "held": []}, "feeds": {}, "origin": None, "subs": {},
                   "origins": None})]


def snapshot(data: bytes) -> None:
    from eva.snapshot import restore
    from eva.state import SnapshotError

    try:
        restore(data)
    except SnapshotError as exc:
        assert str(exc)


def snapshot_seeds() -> list[bytes]:
    from eva.engine import Engine, EngineConfig
    from eva.events import from_cloudevent
    from eva.parser import parse
    from eva.snapshot import snapshot as take

    engine = Engine(EngineConfig())
    engine.add_document(parse('class A = type == "a"\nclass B = type == "b"\n'
                              "profile P = ((all_dup(A); last_dup(B))_10s)_all_pairs\n"))
    for i, kind in enumerate("aab"):
        engine.push(from_cloudevent({"specversion": "1.0", "id": f"e{i}", "source": "s",
                                     "type": kind, "time": f"2026-03-02T10:00:0{i}Z"}, i))
    return [take(engine)]


def token(data: bytes) -> None:
    from mediator.delivery import TokenError, token_position
    from mediator.store.base import SubscriptionRecord

    record = SubscriptionRecord("alice", "P", "", 1_700_000_000, 0, None)
    try:
        token_position(_text(data), record)
    except TokenError as exc:
        assert str(exc)


def token_seeds() -> list[bytes]:
    from mediator.delivery import resume_token
    from mediator.store.base import SubscriptionRecord

    return [resume_token(SubscriptionRecord("alice", "P", "", 1_700_000_000, 0, None), 42).encode()]


def _targets() -> dict[str, Target]:
    found = [Target("profile", profile, profile_seeds), Target("event", event, event_seeds),
             Target("config", config, config_seeds), Target("message", message, message_seeds),
             Target("mapping", mapping_rules, mapping_rules_seeds),
             Target("checkpoint", checkpoint, checkpoint_seeds),
             Target("snapshot", snapshot, snapshot_seeds), Target("token", token, token_seeds)]
    found += [Target(f"native-{g}", native(g), native_seeds(g))
              for g in ("cg1", "cg2", "cg3", "cg4", "cg5")]
    return {t.name: t for t in found}


TARGETS = _targets()
"""Every reader of outside bytes, by name."""
