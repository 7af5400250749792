"""The mediator's configuration: a TOML file (``evamed serve --config FILE``), then environment
variables ``EVAMED_*`` over it (docs/operations.md, Configure, lists every key).

Every key has one converter that reads it from TOML or from an environment variable's text
alike, so a value is checked the same way wherever it comes from; an unknown key, a wrong type
or a value out of range is a :class:`ConfigError` naming the file (or variable), the key, what
was found and what was expected. Without a file and variables: the defaults below (SQLite at
./evamed.db, the in-process composer, no services: every profile evaluated at the mediator).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tomllib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eva.admission import CAPACITY, DEFAULT_LATENESS, DEFAULT_MAX_BYTES, Rules
from eva.units import format_span, parse_span

if TYPE_CHECKING:
    from adapters.mapping import Mapping as EventMapping
    from adapters.mqtt import BrokerSettings
    from adapters.mqtt import Tls as BrokerTls
    from adapters.redis_source import RedisSourceConfig
    from transforms.federated import Coverage, ServiceInfo

DEFAULT_LISTEN = "127.0.0.1:50060"
COMPOSERS = ("inprocess", "spark")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
SOURCE_KINDS = ("mqtt", "redis")
SINK_MODES = ("structured", "binary")
DEFAULT_SINK_TOPIC = "evamed/{profile}/{partition}"
RESERVED_SERVICE = "mediator"
"""The name notifications give the mediator's own feed (Publish): no service may take it."""


class ConfigError(ValueError):
    """A configuration that cannot be used: where, what was found, what was expected."""


@dataclass(frozen=True)
class Limits:
    """Per client (docs/operations.md, Secure)."""

    profiles: int = 100            # subscriptions registered at once
    depth: int = 20                # operators nested in a profile's expression
    time_frame: int | None = None  # µs: the longest span of an operator (None: no limit)
    rate: float = 1000.0           # notifications per second sent to the client (0: no limit)
    profile_bytes: int = 1 << 20   # a profile document's size in UTF-8
    read_time: int = 10_000_000    # µs: reading a profile document (in a worker; then refused)
    composites: int = 10_000       # per operator and event of a profile (0: no limit): beyond
    # it the subscription is suspended (eva.engine.COMPOSITE_LIMIT, docs/operations.md)


@dataclass(frozen=True)
class Tls:
    cert: str = ""       # the server's certificate chain (PEM); empty: no TLS
    key: str = ""        # its private key (PEM)
    client_ca: str = ""  # set: clients must present a certificate this CA signed

    @property
    def enabled(self) -> bool:
        return bool(self.cert)


MODES = ("autonomous", "fed")
"""A service's mode: ``autonomous`` — it has producers of its own, the mediator only
subscribes (the default for a service at an address); ``fed`` — the mediator forwards it the
events of its own feed that its coverage observes (an embedded one always)."""


@dataclass(frozen=True)
class ServiceConfig:
    """A connected service: its group, its coverage (what it observes), its mode, and — when
    autonomous — its idle timeout (µs; None: the top-level ``idle_timeout``) and the interval
    of its heartbeats (µs)."""

    name: str
    group: str
    address: str = "embedded"  # host:port of a base service, or run in the mediator's process
    sources: tuple[str, ...] = ("*",)
    types: tuple[str, ...] = ("*",)
    mode: str = ""  # "" until loaded: autonomous at an address, fed when embedded
    idle_timeout: int | None = None
    heartbeat: int = 200_000

    @property
    def autonomous(self) -> bool:
        return (self.mode or ("fed" if self.address == "embedded" else "autonomous")) == (
            "autonomous")

    def info(self) -> ServiceInfo:
        """What the planner knows of it."""
        from transforms.capability import PRESETS
        from transforms.federated import Coverage, ServiceInfo

        return ServiceInfo(self.name, self.group, PRESETS[self.group],
                           Coverage(self.sources, self.types), self.autonomous)


@dataclass(frozen=True)
class MqttSourceConfig:
    """An MQTT broker as a source (``[[sources]]`` with ``kind = "mqtt"``; docs/sources.md):
    its broker settings, its mapping, the QoS of its subscriptions and, if the configuration
    states one, its coverage (default: the mapping's)."""

    name: str
    broker: BrokerSettings
    mapping: EventMapping
    qos: int = 1
    coverage: Coverage | None = None

    def info(self) -> ServiceInfo:
        """What the planner knows of it: a CG-0 service observing what its mapping produces
        (or the coverage stated) — as :class:`adapters.mqtt_source.MqttSource` reports."""
        from transforms.capability import CG0
        from transforms.federated import ServiceInfo

        return ServiceInfo(self.name, "cg0", CG0, self.coverage or self.mapping.coverage())


@dataclass(frozen=True)
class SinkConfig:
    """Composites to an MQTT broker (``[[sinks]]``; docs/sources.md). ``profiles``: entries
    ``owner/name`` (every composite of that subscription) or a profile's name (its composites
    in every subscription); empty: every subscription's."""

    name: str
    broker: BrokerSettings
    topic: str = DEFAULT_SINK_TOPIC
    mode: str = "structured"
    profiles: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeadLetters:
    """The dead-letter log (docs/operations.md, Dead letters)."""

    retention: int = 100_000   # letters kept (the oldest dropped beyond)
    raw_bytes: int = 65_536    # of each refused input's raw bytes kept


@dataclass(frozen=True)
class SourceLimits:
    """What a ``[[sources]]`` table states over the top-level settings (None: those)."""

    lateness: int | None = None
    max_event_bytes: int | None = None


PUBLISH_LANE = "publish"
"""The lane of events that come through ``Publish`` (a broker source's lane is its name)."""


@dataclass(frozen=True)
class Config:
    listen: str = DEFAULT_LISTEN
    store: str = "sqlite://evamed.db"
    composer: str = "inprocess"  # milliseconds, no Java; "spark" where a cluster's scale pays
    tick: int = 1_000_000
    future: int = 86_400_000_000
    retention: int = 100_000
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    metrics_token: str = field(default="", repr=False)  # a secret: never shown
    log_json: bool = False
    log_level: str = "INFO"
    drain: int = 3_000_000
    idle_timeout: int = 5_000_000
    checkpoint_interval: int = 30_000_000
    checkpoint_events: int = 100_000
    lateness: int = DEFAULT_LATENESS
    max_event_bytes: int = DEFAULT_MAX_BYTES
    reorder_buffer: int = CAPACITY
    limits: Limits = field(default_factory=Limits)
    dead_letters: DeadLetters = field(default_factory=DeadLetters)
    tls: Tls = field(default_factory=Tls)
    services: tuple[ServiceConfig, ...] = ()
    sources: tuple[MqttSourceConfig | RedisSourceConfig, ...] = ()
    sinks: tuple[SinkConfig, ...] = ()
    source_limits: Mapping[str, SourceLimits] = field(default_factory=dict)
    """Per ``[[sources]]`` name: its ``lateness`` and ``max_event_bytes`` when stated."""

    def __repr__(self) -> str:
        """The dataclass's repr with passwords redacted (the store URL's, a broker's): a
        configuration is printed and logged (issue 29)."""
        from mediator.logs import redact

        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return redact(f"Config({shown})")

    def admission(self) -> Rules:
        """The door's rules (eva/admission.py): the lateness and size limit of each lane —
        ``publish`` and each source, its own or the top level's —, the horizon (``future``),
        ids remembered as long as the count allows, the reorder buffer's size."""
        lanes = {name: s.lateness for name, s in self.source_limits.items()
                 if s.lateness is not None}
        sizes = {name: s.max_event_bytes for name, s in self.source_limits.items()
                 if s.max_event_bytes is not None}
        return Rules(lateness=self.lateness, lanes=lanes, horizon=self.future, remember=None,
                     capacity=self.reorder_buffer, max_bytes=self.max_event_bytes, sizes=sizes)


# ---------------------------------------------------------------- converters
# Each takes a value from TOML, or the text of an environment variable, and where it came from.

Convert = Callable[[Any, str], Any]


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: found {value!r}, expected a string")
    return value


def _whole(minimum: int) -> Convert:
    def convert(value: Any, where: str) -> int:
        if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]{1,19}", value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{where}: found {value!r}, expected a whole number ≥ {minimum}")
        return value
    return convert


def _rate(value: Any, where: str) -> float:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e12:
        raise ConfigError(f"{where}: found {value!r}, expected a number ≥ 0 (per second; 0: no limit)")
    return float(value)


def _flag(value: Any, where: str) -> bool:
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: found {value!r}, expected true or false")
    return value


def _span(minimum: int, unbounded: bool = False) -> Convert:
    def convert(value: Any, where: str) -> int | None:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: found {value!r}, expected a span with a unit, e.g. \"1s\""
                              + (" or \"inf\"" if unbounded else ""))
        try:
            span = parse_span(value.strip())
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if span is None and not unbounded:
            raise ConfigError(f"{where}: found \"inf\", expected a finite span")
        if span is not None and span < minimum:
            raise ConfigError(f"{where}: found {value!r}, expected at least {format_span(minimum)}")
        return span
    return convert


def _choice(options: tuple[str, ...], fold: Callable[[str], str] = str.lower) -> Convert:
    def convert(value: Any, where: str) -> str:
        text = fold(_text(value, where).strip())
        if text not in options:
            raise ConfigError(f"{where}: found {value!r}, expected one of: {', '.join(options)}")
        return text
    return convert


def _address(value: Any, where: str) -> str:
    text = _text(value, where).strip()
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{where}: found {value!r}, expected host:port (port 0: any free port)")
    return text


def _store(value: Any, where: str) -> str:
    from mediator.store import parse_store_url

    try:
        parse_store_url(_text(value, where))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return str(value)


def _patterns(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):  # an environment variable: comma-separated
        value = [p.strip() for p in value.split(",")]
    if (not isinstance(value, list) or not value
            or not all(isinstance(p, str) and p for p in value)):
        raise ConfigError(f"{where}: found {value!r}, expected a non-empty list of patterns "
                          "(fnmatch, e.g. [\"cg2/*\"])")
    return tuple(value)


def _port(value: Any, where: str) -> int:
    port: int = _whole(1)(value, where)
    if port > 65535:
        raise ConfigError(f"{where}: found {value!r}, expected a port from 1 to 65535")
    return port


def _protocol(value: Any, where: str) -> str:
    """MQTT ``"5"`` or ``"3.1.1"`` (TOML may write the first as the number 5)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text: str = _choice(("5", "3.1.1"))(value, where)
    return text


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
        raise ConfigError(f"{where}: found {value!r}, expected a number of seconds > 0")
    return float(value)


def _broker_tls(value: Any, where: str) -> BrokerTls:
    from adapters.mqtt import Tls as BrokerTls

    if not isinstance(value, dict):
        raise ConfigError(f"{where}: found {value!r}, expected a table {{ca_file = …, cert_file "
                          "= …, key_file = …, insecure = false} ({}: TLS with the system's CAs)")
    _known(value, ["ca_file", "cert_file", "key_file", "insecure"], where, "")
    files = {k: _text(value[k], f"{where}.{k}") for k in ("ca_file", "cert_file", "key_file")
             if k in value}
    return BrokerTls(**files, insecure=_flag(value.get("insecure", False), f"{where}.insecure"))


def _names(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) and p.strip() for p in value):
        raise ConfigError(f"{where}: found {value!r}, expected a list of subscriptions "
                          "(\"owner/name\") and profile names")
    return tuple(value)


# ---------------------------------------------------------------- the keys

_TOP: dict[str, Convert] = {
    "listen": _address, "store": _store, "composer": _choice(COMPOSERS), "tick": _span(1),
    "future": _span(0), "retention": _whole(1), "metrics_port": _whole(0),
    "metrics_host": _text, "metrics_token": _text, "log_json": _flag,
    "log_level": _choice(LOG_LEVELS, str.upper),
    "drain": _span(0), "idle_timeout": _span(1), "checkpoint_interval": _span(1_000_000),
    "checkpoint_events": _whole(1), "lateness": _span(0), "max_event_bytes": _whole(64),
    "reorder_buffer": _whole(1),
}
_SECTIONS: dict[str, tuple[type, dict[str, Convert]]] = {
    "limits": (Limits, {"profiles": _whole(1), "depth": _whole(0),
                        "time_frame": _span(0, unbounded=True), "rate": _rate,
                        "profile_bytes": _whole(1), "read_time": _span(1),
                        "composites": _whole(0)}),
    "tls": (Tls, {"cert": _text, "key": _text, "client_ca": _text}),
    "dead_letters": (DeadLetters, {"retention": _whole(1), "raw_bytes": _whole(0)}),
}
_SERVICE: dict[str, Convert] = {"name": _text, "group": _text, "address": _text,
                                "sources": _patterns, "types": _patterns,
                                "mode": _choice(MODES), "idle_timeout": _span(1),
                                "heartbeat": _span(10_000)}
_BROKER: dict[str, Convert] = {
    "host": _text, "port": _port, "protocol": _protocol, "client_id": _text, "username": _text,
    "password": _text, "tls": _broker_tls, "keepalive": _whole(1), "session_expiry": _whole(0),
    "backoff_initial": _seconds, "backoff_max": _seconds, "connect_timeout": _seconds}
"""An MQTT broker's settings (adapters.mqtt.BrokerSettings), in a source's or a sink's table."""
_MQTT_SOURCE = ("name", "kind", "rules", "qos", "sources", "types", *_BROKER)
"""The keys of an MQTT source's table (:func:`_mqtt_source` reads them)."""
_SOURCE_LIMITS: dict[str, Convert] = {"lateness": _span(0), "max_event_bytes": _whole(64)}
"""The keys of a ``[[sources]]`` table of either kind over the top-level settings."""
_SINK: dict[str, Convert] = {"name": _text, "kind": _choice(("mqtt",)), "topic": _text,
                             "mode": _choice(SINK_MODES), "profiles": _names, **_BROKER}
_LISTS = ("services", "sources", "sinks")


def _source_keys() -> list[str]:
    """The keys of a ``[[sources]]`` table of either kind (each kind then checks its own)."""
    from adapters.redis_source import KEYS as REDIS_KEYS

    return list(dict.fromkeys([*_MQTT_SOURCE, *sorted(REDIS_KEYS), *_SOURCE_LIMITS]))


def env_name(*path: str) -> str:
    """The environment variable of a key: ``EVAMED_LISTEN``, ``EVAMED_LIMITS_RATE``."""
    return "EVAMED_" + "_".join(path).upper()


def keys() -> list[str]:
    """Every key as written in the file (``limits.rate``), for the docs and their test."""
    lists = {"services": list(_SERVICE), "sources": _source_keys(), "sinks": list(_SINK)}
    return [*_TOP, *(f"{s}.{k}" for s, (_, table) in _SECTIONS.items() for k in table),
            *(key for name, known in lists.items()
              for key in (name, *(f"{name}[].{k}" for k in known)))]


def load(path: Path | None = None, environ: Mapping[str, str] | None = None,
         options: Mapping[str, str] | None = None) -> Config:
    """The configuration of ``path`` (None: the defaults) with ``environ``'s ``EVAMED_*``
    variables over it (None: the process environment), and command-line ``options`` (top-level
    keys, e.g. ``{"listen": …}``) over both."""
    env: dict[str, str] = dict(os.environ if environ is None else environ)
    env.update({env_name(key): value for key, value in (options or {}).items()})
    given = {env_name(key): f"--{key}" for key in options or {}}
    origin = str(path) if path is not None else "defaults"
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read the configuration {path}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: byte {exc.start} is not UTF-8, expected a UTF-8 TOML "
                              "file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not TOML: {exc}") from None
    _known(raw, [*_TOP, *_SECTIONS, *_LISTS], origin, "")
    values: dict[str, Any] = {}
    for key, convert in _TOP.items():
        value, where = _pick(raw, env, origin, key)
        if value is not None:
            values[key] = convert(value, given.get(where, where))
    for section, (kind, table) in _SECTIONS.items():
        given = raw.get(section, {})
        if not isinstance(given, dict):
            raise ConfigError(f"{origin}: {section}: found {given!r}, expected a table [{section}]")
        _known(given, list(table), origin, f"{section}.")
        parts: dict[str, Any] = {}
        for key, convert in table.items():
            value, where = _pick(given, env, origin, section, key)
            if value is not None:
                parts[key] = convert(value, where)
        values[section] = kind(**parts)
    values["services"] = _services(_tables(raw, env, origin, "services", list(_SERVICE)))
    limits: dict[str, SourceLimits] = {}
    values["sources"] = _sources(_tables(raw, env, origin, "sources", _source_keys()),
                                 values["services"], limits)
    values["source_limits"] = limits
    values["sinks"] = _sinks(_tables(raw, env, origin, "sinks", list(_SINK)))
    config = Config(**values)
    _check_tls(config.tls, origin)
    _check_pace(config, origin)
    return config


PACED_SECONDS = 10
"""A subscription's log keeps at least this many seconds of notifications at ``limits.rate``."""


def _check_pace(config: Config, origin: str) -> None:
    """``retention`` and ``limits.rate`` together: a log that holds less than PACED_SECONDS of
    delivery at the rate would be trimmed under a reader the mediator itself holds back (the
    pace is lifted half the retention behind the head, docs/operations.md, "Delivery")."""
    rate = config.limits.rate
    if rate > 0 and config.retention < PACED_SECONDS * rate:
        raise ConfigError(f"{origin}: retention {config.retention:,} holds less than "
                          f"{PACED_SECONDS} s of limits.rate ({rate:,g}/s); expected retention "
                          f"≥ {PACED_SECONDS * rate:,.0f}, or a lower rate")


def _known(table: Mapping[str, Any], known: list[str], origin: str, prefix: str) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"{origin}: unknown key {prefix}{key}; expected one of: "
                              + ", ".join(prefix + k for k in known))


def _pick(table: Mapping[str, Any], env: Mapping[str, str], origin: str,
          *path: str) -> tuple[Any, str]:
    """A key's value and where it came from: its environment variable, else the file."""
    name = env_name(*path)
    if name in env:
        return env[name], name
    return table.get(path[-1]), f"{origin}: {'.'.join(path)}"


def _tables(raw: Mapping[str, Any], env: Mapping[str, str], origin: str, key: str,
            known: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The tables of a list key (``[[services]]``, ``[[sources]]``, ``[[sinks]]``) — from its
    environment variable (a JSON list of objects) if set, else the file — each with where it
    is (``FILE: sources[2]``), its keys checked against ``known``."""
    value: Any = raw.get(key, [])
    where = f"{origin}: {key}"
    if env_name(key) in env:
        where = env_name(key)
        try:
            value = json.loads(env[where])
        except ValueError as exc:
            raise ConfigError(f"{where}: not JSON ({exc}); expected a list of objects with "
                              f"the keys {', '.join(known)}") from None
    if not isinstance(value, list):
        raise ConfigError(f"{where}: found {value!r}, expected a list of tables ([[{key}]])")
    for number, item in enumerate(value, 1):
        here = f"{where}[{number}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{here}: found {item!r}, expected a table with the keys "
                              + ", ".join(known))
        _known(item, known, here, "")
        if "name" not in item:
            raise ConfigError(f"{here}: missing name")
        yield here, item


def _services(tables: Iterator[tuple[str, dict[str, Any]]]) -> tuple[ServiceConfig, ...]:
    from transforms.capability import PRESETS

    out: list[ServiceConfig] = []
    wheres: list[str] = []
    for here, item in tables:
        wheres.append(here)
        if "group" not in item:
            raise ConfigError(f"{here}: missing group")
        parts = {k: _SERVICE[k](v, f"{here}.{k}") for k, v in item.items()}
        service = ServiceConfig(**parts)
        _unique(service.name, here, [s.name for s in out], "service")
        if service.group not in PRESETS:
            raise ConfigError(f"{here}.group: found {service.group!r}, expected one of: "
                              + ", ".join(PRESETS))
        if service.address != "embedded":
            _address(service.address, f"{here}.address")
        elif service.mode == "autonomous":
            raise ConfigError(f"{here}.mode: an embedded service is evaluated in the "
                              "mediator's process, where no producer reaches it: it can only "
                              "be fed (mode = \"fed\"); give an address for an autonomous one")
        out.append(service)
    _disjoint([(here, s) for here, s in zip(wheres, out, strict=True)])
    return tuple(out)


def _disjoint(services: list[tuple[str, ServiceConfig]]) -> None:
    """Autonomous services observe disjoint parts of the merged trace: each event is produced
    at one of them (the planner relies on it — a service covering a class is the only place
    its events are). Two whose coverages may both match an event are refused."""
    autonomous = [(here, s) for here, s in services if s.autonomous]
    for i, (here, a) in enumerate(autonomous):
        for _, b in autonomous[i + 1:]:
            types = _meeting(a.types, b.types)
            sources = _meeting(a.sources, b.sources)
            if types and sources:
                raise ConfigError(
                    f"{here}: the autonomous services {a.name!r} and {b.name!r} may both observe "
                    f"events of type {types} and source {sources}; autonomous services observe "
                    "disjoint parts of the events (each event is produced at one of them): "
                    "narrow their types or sources")


def _meeting(left: tuple[str, ...], right: tuple[str, ...]) -> str:
    """A pair of patterns, one of each, that may match the same value ("" if none may):
    two literals if equal, a literal and a pattern if it matches, two patterns unless their
    fixed prefixes or suffixes differ."""
    for a in left:
        for b in right:
            if _meet(a, b):
                return a if a == b else f"{a} / {b}"
    return ""


def _meet(a: str, b: str) -> bool:
    from fnmatch import fnmatchcase

    wild = "*?["
    if not any(c in a for c in wild) or not any(c in b for c in wild):
        literal, pattern = (a, b) if not any(c in a for c in wild) else (b, a)
        return fnmatchcase(literal, pattern)

    def fixed(p: str) -> tuple[str, str]:
        head = min((p.index(c) for c in wild if c in p), default=len(p))
        tail = max((p.rindex(c) for c in wild if c in p), default=-1)
        return p[:head], p[tail + 1:]

    (ha, ta), (hb, tb) = fixed(a), fixed(b)
    return (ha.startswith(hb) or hb.startswith(ha)) and (ta.endswith(tb) or tb.endswith(ta))


def _unique(name: str, here: str, taken: Collection[str], what: str) -> None:
    """A service's (or source's, sink's) name: not empty, not the mediator's, not taken."""
    if not name.strip() or name == RESERVED_SERVICE:
        raise ConfigError(f"{here}.name: found {name!r}, expected a name other than "
                          f"{RESERVED_SERVICE!r} (the mediator's own feed) and not empty")
    if name in taken:
        raise ConfigError(f"{here}.name: {name!r} is taken by another {what}")


def _sources(tables: Iterator[tuple[str, dict[str, Any]]], services: tuple[ServiceConfig, ...],
             limits: dict[str, SourceLimits]) -> tuple[MqttSourceConfig | RedisSourceConfig, ...]:
    """The ``[[sources]]``: each a link of the pipeline, so its name is a service's name too;
    what a table states of the top-level settings (lateness, max_event_bytes) in ``limits``."""
    from adapters.mapping import MappingConfigError
    from adapters.redis_source import parse_config

    out: list[MqttSourceConfig | RedisSourceConfig] = []
    for here, table in tables:
        item = {k: v for k, v in table.items() if k not in _SOURCE_LIMITS}
        name = _text(item["name"], f"{here}.name")
        stated = {k: _SOURCE_LIMITS[k](table[k], f"{here}.{k}") for k in _SOURCE_LIMITS
                  if k in table}
        if stated:
            limits[name] = SourceLimits(**stated)
        _unique(name, here, [s.name for s in (*services, *out)], "service or source")
        if "kind" not in item:
            raise ConfigError(f"{here}: missing kind (one of: {', '.join(SOURCE_KINDS)})")
        kind = _choice(SOURCE_KINDS)(item["kind"], f"{here}.kind")
        try:
            out.append(parse_config(name, item) if kind == "redis"
                       else _mqtt_source(name, item, here))
        except MappingConfigError as exc:  # it names the source, the rule, the key
            raise ConfigError(f"{here}: {exc}") from None
    return tuple(out)


def _mqtt_source(name: str, item: dict[str, Any], here: str) -> MqttSourceConfig:
    from adapters.mapping import parse_mapping
    from transforms.federated import Coverage

    _known(item, list(_MQTT_SOURCE), here, "")
    if "rules" not in item:
        raise ConfigError(f"{here}: missing rules (the mapping, [[sources.rules]] tables: "
                          "topic, type, … — docs/sources.md)")
    coverage = None
    if "sources" in item or "types" in item:
        coverage = Coverage(_patterns(item.get("sources", ["*"]), f"{here}.sources"),
                            _patterns(item.get("types", ["*"]), f"{here}.types"))
    qos = item.get("qos", 1)
    if qos not in (0, 1) or isinstance(qos, bool):
        raise ConfigError(f"{here}.qos: found {qos!r}, expected 1 (at least once) or 0 (at "
                          "most once)")
    return MqttSourceConfig(name, _broker(item, here), parse_mapping(name, item["rules"]), qos,
                            coverage)


def _sinks(tables: Iterator[tuple[str, dict[str, Any]]]) -> tuple[SinkConfig, ...]:
    from adapters.mqtt_sink import check_sink

    out: list[SinkConfig] = []
    for here, item in tables:
        parts = {k: _SINK[k](v, f"{here}.{k}") for k, v in item.items() if k not in _BROKER}
        parts.pop("kind", None)
        sink = SinkConfig(broker=_broker(item, here), **parts)
        _unique(sink.name, here, [s.name for s in out], "sink")
        try:
            check_sink(sink.topic, sink.mode, sink.broker.protocol)
        except ValueError as exc:
            raise ConfigError(f"{here}: {exc}") from None
        out.append(sink)
    return tuple(out)


def _broker(item: Mapping[str, Any], here: str) -> BrokerSettings:
    """The broker settings of an MQTT source's or sink's table."""
    from adapters.mqtt import BrokerSettings

    parts = {k: convert(item[k], f"{here}.{k}") for k, convert in _BROKER.items() if k in item}
    try:
        return BrokerSettings(**parts)
    except ValueError as exc:
        raise ConfigError(f"{here}: {exc}") from None


def _check_tls(tls: Tls, origin: str) -> None:
    if bool(tls.cert) != bool(tls.key):
        raise ConfigError(f"{origin}: tls.cert and tls.key go together (found only "
                          f"{'tls.cert' if tls.cert else 'tls.key'})")
    if tls.client_ca and not tls.cert:
        raise ConfigError(f"{origin}: tls.client_ca needs tls.cert and tls.key (client "
                          "certificates are checked over TLS)")


__all__ = ["COMPOSERS", "DEFAULT_LISTEN", "MODES", "PUBLISH_LANE", "Config", "ConfigError",
           "DeadLetters", "Limits", "MqttSourceConfig", "ServiceConfig", "SinkConfig",
           "SourceLimits", "Tls", "env_name", "keys", "load"]
