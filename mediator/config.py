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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eva.units import format_span, parse_span

DEFAULT_LISTEN = "127.0.0.1:50060"
COMPOSERS = ("inprocess", "spark")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
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


@dataclass(frozen=True)
class Tls:
    cert: str = ""       # the server's certificate chain (PEM); empty: no TLS
    key: str = ""        # its private key (PEM)
    client_ca: str = ""  # set: clients must present a certificate this CA signed

    @property
    def enabled(self) -> bool:
        return bool(self.cert)


@dataclass(frozen=True)
class ServiceConfig:
    """A connected service: its group and its coverage (what it observes)."""

    name: str
    group: str
    address: str = "embedded"  # host:port of a base service, or run in the mediator's process
    sources: tuple[str, ...] = ("*",)
    types: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class Config:
    listen: str = DEFAULT_LISTEN
    store: str = "sqlite://evamed.db"
    composer: str = "inprocess"
    tick: int = 1_000_000
    lateness: int = 0
    retention: int = 100_000
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    log_json: bool = False
    log_level: str = "INFO"
    drain: int = 3_000_000
    limits: Limits = field(default_factory=Limits)
    tls: Tls = field(default_factory=Tls)
    services: tuple[ServiceConfig, ...] = ()


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


# ---------------------------------------------------------------- the keys

_TOP: dict[str, Convert] = {
    "listen": _address, "store": _store, "composer": _choice(COMPOSERS), "tick": _span(1),
    "lateness": _span(0), "retention": _whole(1), "metrics_port": _whole(0),
    "metrics_host": _text, "log_json": _flag, "log_level": _choice(LOG_LEVELS, str.upper),
    "drain": _span(0),
}
_SECTIONS: dict[str, tuple[type, dict[str, Convert]]] = {
    "limits": (Limits, {"profiles": _whole(1), "depth": _whole(0),
                        "time_frame": _span(0, unbounded=True), "rate": _rate,
                        "profile_bytes": _whole(1)}),
    "tls": (Tls, {"cert": _text, "key": _text, "client_ca": _text}),
}
_SERVICE: dict[str, Convert] = {"name": _text, "group": _text, "address": _text,
                                "sources": _patterns, "types": _patterns}


def env_name(*path: str) -> str:
    """The environment variable of a key: ``EVAMED_LISTEN``, ``EVAMED_LIMITS_RATE``."""
    return "EVAMED_" + "_".join(path).upper()


def keys() -> list[str]:
    """Every key as written in the file (``limits.rate``), for the docs and their test."""
    return [*_TOP, *(f"{s}.{k}" for s, (_, table) in _SECTIONS.items() for k in table),
            "services", *(f"services[].{k}" for k in _SERVICE)]


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
    _known(raw, [*_TOP, *_SECTIONS, "services"], origin, "")
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
    services: Any = raw.get("services", [])
    where = f"{origin}: services"
    if env_name("services") in env:
        where = env_name("services")
        try:
            services = json.loads(env[where])
        except ValueError as exc:
            raise ConfigError(f"{where}: not JSON ({exc}); expected a list of objects with "
                              f"the keys {', '.join(_SERVICE)}") from None
    values["services"] = _services(services, where)
    config = Config(**values)
    _check_tls(config.tls, origin)
    return config


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


def _services(value: Any, where: str) -> tuple[ServiceConfig, ...]:
    from transforms.capability import PRESETS

    if not isinstance(value, list):
        raise ConfigError(f"{where}: found {value!r}, expected a list of services ([[services]])")
    out: list[ServiceConfig] = []
    for number, item in enumerate(value, 1):
        here = f"{where}[{number}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{here}: found {item!r}, expected a table with the keys "
                              + ", ".join(_SERVICE))
        _known(item, list(_SERVICE), here, "")
        for key in ("name", "group"):
            if key not in item:
                raise ConfigError(f"{here}: missing {key}")
        parts = {k: _SERVICE[k](v, f"{here}.{k}") for k, v in item.items()}
        service = ServiceConfig(**parts)
        if not service.name.strip() or service.name == RESERVED_SERVICE:
            raise ConfigError(f"{here}.name: found {service.name!r}, expected a name other than "
                              f"{RESERVED_SERVICE!r} (the mediator's own feed) and not empty")
        if any(s.name == service.name for s in out):
            raise ConfigError(f"{here}.name: {service.name!r} is taken by another service")
        if service.group not in PRESETS:
            raise ConfigError(f"{here}.group: found {service.group!r}, expected one of: "
                              + ", ".join(PRESETS))
        if service.address != "embedded":
            _address(service.address, f"{here}.address")
        out.append(service)
    return tuple(out)


def _check_tls(tls: Tls, origin: str) -> None:
    if bool(tls.cert) != bool(tls.key):
        raise ConfigError(f"{origin}: tls.cert and tls.key go together (found only "
                          f"{'tls.cert' if tls.cert else 'tls.key'})")
    if tls.client_ca and not tls.cert:
        raise ConfigError(f"{origin}: tls.client_ca needs tls.cert and tls.key (client "
                          "certificates are checked over TLS)")


__all__ = ["COMPOSERS", "DEFAULT_LISTEN", "Config", "ConfigError", "Limits", "ServiceConfig",
           "Tls", "env_name", "keys", "load"]
