"""The mediator's configuration (mediator/config.py): TOML, EVAMED_* variables over it, every
key documented, and every bad value refused with where, what was found and what was expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mediator.config import Config, ConfigError, Limits, ServiceConfig, Tls, env_name, keys, load

FULL = """
listen = "0.0.0.0:7000"
store = "redis://127.0.0.1:6379/2"
composer = "spark"
tick = "500ms"
future = "2s"
retention = 500
metrics_port = 9464
metrics_host = "0.0.0.0"
log_json = true
log_level = "debug"
drain = "5s"

[limits]
profiles = 7
depth = 4
time_frame = "1h"
rate = 2.5
profile_bytes = 4096
read_time = "30s"

[tls]
cert = "server.pem"
key = "server.key"
client_ca = "clients.pem"

[[services]]
name = "trucks"
group = "cg2"
address = "127.0.0.1:50051"
sources = ["trucks/*"]

[[services]]
name = "orders"
group = "cg3"
types = ["order.*", "goods.*"]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mediator.toml"
    path.write_text(text)
    return path


def test_no_file_and_no_variables_give_the_defaults() -> None:
    assert load(None, {}) == Config()
    assert Config().store == "sqlite://evamed.db" and Config().services == ()


def test_a_file_sets_every_key(tmp_path: Path) -> None:
    config = load(write(tmp_path, FULL), {})
    assert config == Config(
        listen="0.0.0.0:7000", store="redis://127.0.0.1:6379/2", composer="spark", tick=500_000,
        future=2_000_000, retention=500, metrics_port=9464, metrics_host="0.0.0.0",
        log_json=True, log_level="DEBUG", drain=5_000_000,
        limits=Limits(profiles=7, depth=4, time_frame=3_600_000_000, rate=2.5, profile_bytes=4096,
                      read_time=30_000_000),
        tls=Tls("server.pem", "server.key", "clients.pem"),
        services=(ServiceConfig("trucks", "cg2", "127.0.0.1:50051", ("trucks/*",), ("*",)),
                  ServiceConfig("orders", "cg3", "embedded", ("*",), ("order.*", "goods.*"))))


def test_environment_variables_override_the_file(tmp_path: Path) -> None:
    env = {"EVAMED_LISTEN": "127.0.0.1:0", "EVAMED_LIMITS_RATE": "0", "EVAMED_LOG_JSON": "no",
           "EVAMED_TICK": "1s", "EVAMED_LIMITS_TIME_FRAME": "inf", "EVAMED_TLS_CLIENT_CA": "",
           "EVAMED_SERVICES": json.dumps([{"name": "x", "group": "cg1", "sources": ["a"]}]),
           "EVAMED_SERVER": "ignored: the client's variable", "EVAMED_TOKEN": "evm_ignored"}
    config = load(write(tmp_path, FULL), env)
    assert (config.listen, config.limits.rate, config.log_json, config.tick) == (
        "127.0.0.1:0", 0.0, False, 1_000_000)
    assert config.limits.time_frame is None and config.limits.profiles == 7
    assert config.tls.client_ca == "" and config.tls.cert == "server.pem"
    assert config.services == (ServiceConfig("x", "cg1", sources=("a",)),)
    assert load(None, {"EVAMED_RETENTION": "12", "EVAMED_LIMITS_RATE": "1.2"}).retention == 12


def test_retention_must_hold_ten_seconds_of_the_rate() -> None:
    """`retention` and `limits.rate` are checked together: a log that keeps less than 10 s of
    delivery at the rate is refused at start, naming both (issue 29)."""
    with pytest.raises(ConfigError, match=r"EVAMED_RETENTION|retention 12 holds less than 10 s "
                       r"of limits.rate \(1,000/s\); expected retention ≥ 10,000"):
        load(None, {"EVAMED_RETENTION": "12"})
    assert load(None, {"EVAMED_RETENTION": "100", "EVAMED_LIMITS_RATE": "0"}).retention == 100


@pytest.mark.parametrize(("text", "env", "message"), [
    ("listne = 'x'", {}, "unknown key listne; expected one of: listen"),
    ("[limits]\nprofile = 3", {}, "unknown key limits.profile; expected one of: limits.profiles"),
    ("retention = 0", {}, "retention: found 0, expected a whole number ≥ 1"),
    ("", {"EVAMED_RETENTION": "ten"}, "EVAMED_RETENTION: found 'ten', expected a whole number"),
    ("tick = 1000", {}, "tick: found 1000, expected a span with a unit"),
    ("tick = '1 parsec'", {}, "tick: found '1 parsec', expected digits and a unit"),
    ("tick = '0s'", {}, "tick: found '0s', expected at least 1us"),
    ("future = 'inf'", {}, "future: found \"inf\", expected a finite span"),
    ("composer = 'flink'", {}, "composer: found 'flink', expected one of: inprocess, spark"),
    ("listen = 'localhost'", {}, "listen: found 'localhost', expected host:port"),
    ("log_json = 'maybe'", {}, "log_json: found 'maybe', expected true or false"),
    ("store = 'ftp://x'", {}, "store: the store URL 'ftp'://"),
    ("[limits]\nrate = -1", {}, "limits.rate: found -1, expected a number ≥ 0"),
    ("[tls]\ncert = 'a.pem'", {}, "tls.cert and tls.key go together"),
    ("[tls]\nclient_ca = 'ca.pem'", {}, "tls.client_ca needs tls.cert and tls.key"),
    ("limits = 3", {}, "limits: found 3, expected a table [limits]"),
    ("[[services]]\nname = 'a'", {}, "services[1]: missing group"),
    ("[[services]]\nname = 'a'\ngroup = 'cg9'", {}, "services[1].group: found 'cg9', expected "
     "one of: cg0"),
    ("[[services]]\nname = 'mediator'\ngroup = 'cg1'", {}, "services[1].name: found 'mediator'"),
    ("[[services]]\nname = 'a'\ngroup = 'cg1'\n[[services]]\nname = 'a'\ngroup = 'cg2'", {},
     "services[2].name: 'a' is taken"),
    ("[[services]]\nname = 'a'\ngroup = 'cg1'\nsources = []", {},
     "services[1].sources: found [], expected a non-empty list of patterns"),
    ("[[services]]\nname = 'a'\ngroup = 'cg1'\naddress = 'nowhere'", {},
     "services[1].address: found 'nowhere', expected host:port"),
    ("", {"EVAMED_SERVICES": "[{"}, "EVAMED_SERVICES: not JSON"),
    ("[[sources]]\nname = 'a'", {}, "sources[1]: missing kind (one of: mqtt, redis)"),
    ("[[sources]]\nname = 'a'\nkind = 'kafka'", {}, "sources[1].kind: found 'kafka'"),
    ("[[sources]]\nname = 'a'\nkind = 'mqtt'", {}, "sources[1]: missing rules"),
    ("[[services]]\nname = 'a'\ngroup = 'cg1'\n[[sources]]\nname = 'a'\nkind = 'mqtt'", {},
     "sources[1].name: 'a' is taken by another service or source"),
    ("[[sources]]\nname = 'a'\nkind = 'mqtt'\nstreams = ['s']", {},
     "sources[1]: unknown key streams; expected one of: name, kind, rules"),
    ("[[sources]]\nname = 'a'\nkind = 'mqtt'\nport = 70000\n[[sources.rules]]\ntopic = 'a/+'"
     "\ntype = 't'", {}, "sources[1].port: found 70000, expected a port from 1 to 65535"),
    ("[[sources]]\nname = 'a'\nkind = 'mqtt'\nqos = 2\n[[sources.rules]]\ntopic = 'a/+'"
     "\ntype = 't'", {}, "sources[1].qos: found 2, expected 1 (at least once) or 0"),
    ("[[sources]]\nname = 'a'\nkind = 'mqtt'\n[[sources.rules]]\ntopic = 'a/+x/#y/z'"
     "\ntype = 't'", {}, "sources[1]: source 'a', rule 1: topic 'a/+x/#y/z': '#' must be the "
     "last level"),
    ("[[sources]]\nname = 'a'\nkind = 'redis'\nurl = 'redis://h'\nstreams = []", {},
     "sources[1]: source 'a': streams is [], expected a list of distinct stream names"),
    ("[[sinks]]\nname = 's'\nmode = 'binary'\nprotocol = '3.1.1'", {},
     "sinks[1]: the binary mode needs MQTT 5"),
    ("[[sinks]]\nname = 's'\ntopic = 'out/#'", {}, "sinks[1]: found topic template 'out/#'"),
    ("[[sinks]]\nname = 's'\ntls = {ca = 'x'}", {},
     "sinks[1].tls: unknown key ca; expected one of: ca_file"),
    ("[[sinks]]\nname = 's'\nprofiles = 'P1'", {}, "sinks[1].profiles: found 'P1', expected "
     "a list of subscriptions"),
    ("", {"EVAMED_SINKS": '[{"name": "s", "kind": "kafka"}]'},
     "EVAMED_SINKS[1].kind: found 'kafka', expected one of: mqtt"),
    ("listen = ", {}, "not TOML: "),
])
def test_a_bad_value_says_where_what_and_what_was_expected(tmp_path: Path, text: str,
                                                          env: dict[str, str],
                                                          message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(write(tmp_path, text), env)
    assert message in str(caught.value)
    where = next(iter(env)) if env else str(tmp_path / "mediator.toml")
    assert str(caught.value).startswith(where), str(caught.value)


BROKERS = """
[[sources]]
name = "plant"
kind = "mqtt"
host = "broker.example"
port = 8883
protocol = "3.1.1"
username = "evamed"
password = "s3cret"
tls = {ca_file = "ca.pem", insecure = true}
session_expiry = 3600
backoff_max = 5
qos = 0
types = ["plant.*"]

[[sources.rules]]
topic = "plant/+line/temp"
type = "plant.temp"

[[sources]]
name = "cellar"
kind = "redis"
url = "redis://127.0.0.1:6379/0"
streams = ["cellar/temp"]

[[sinks]]
name = "legacy"
port = 1884
topic = "out/{profile}/{partition}"
mode = "binary"
profiles = ["alice/plant", "HotThenAlarm"]
"""


def test_sources_and_sinks_are_read_with_their_brokers_and_mappings(tmp_path: Path) -> None:
    from adapters.mqtt import BrokerSettings
    from adapters.mqtt import Tls as BrokerTls
    from adapters.redis_source import RedisSourceConfig
    from mediator.config import MqttSourceConfig, SinkConfig
    from transforms.federated import Coverage

    config = load(write(tmp_path, BROKERS), {})
    plant, cellar = config.sources
    assert isinstance(plant, MqttSourceConfig) and isinstance(cellar, RedisSourceConfig)
    assert plant.broker == BrokerSettings(
        "broker.example", 8883, "3.1.1", username="evamed", password="s3cret",
        tls=BrokerTls(ca_file="ca.pem", insecure=True), session_expiry=3600, backoff_max=5.0)
    assert (plant.qos, plant.coverage) == (0, Coverage(("*",), ("plant.*",)))
    assert [r.pattern.text for r in plant.mapping.rules] == ["plant/+line/temp"]
    assert "s3cret" not in repr(config)
    assert (cellar.name, cellar.streams) == ("cellar", ("cellar/temp",))
    assert config.sinks == (SinkConfig("legacy", BrokerSettings(port=1884),
                                       "out/{profile}/{partition}", "binary",
                                       ("alice/plant", "HotThenAlarm")),)
    # The variable replaces the file's list, as EVAMED_SERVICES does.
    env = {"EVAMED_SOURCES": json.dumps([{"name": "x", "kind": "mqtt", "protocol": 5, "rules": [
        {"topic": "a/#", "type": "a"}]}])}
    assert [s.name for s in load(write(tmp_path, BROKERS), env).sources] == ["x"]


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read the configuration .*nothing\.toml"):
        load(tmp_path / "nothing.toml", {})


def test_every_key_and_variable_is_documented() -> None:
    doc = Path(__file__).resolve().parent.parent.joinpath("docs", "operations.md").read_text()
    for key in keys():
        assert f"`{key}`" in doc, key
        if "[]" not in key:
            assert f"`{env_name(*key.split('.'))}`" in doc, key


@pytest.mark.parametrize(("first", "second", "refused"), [
    ('types = ["traffic.*"]', 'types = ["truck.*"]', False),
    ('types = ["traffic.*"]', 'types = ["traffic.jam"]', True),
    ('types = ["a", "end"]', 'types = ["b", "end"]', True),
    ('sources = ["s1"]', 'sources = ["s2"]', False),
    ('sources = ["urn:a:*"]', 'sources = ["urn:*"]', True),
    ('types = ["*"]', 'types = ["x"]\nmode = "fed"', False),
])
def test_autonomous_services_must_observe_disjoint_events(tmp_path: Path, first: str,
                                                          second: str, refused: bool) -> None:
    """The planner takes a class covered by an autonomous service as the only place its events
    are: two autonomous services that may both observe an event are refused, naming them."""
    path = tmp_path / "c.toml"
    path.write_text(f'[[services]]\nname = "one"\ngroup = "cg3"\naddress = "h:1"\n{first}\n'
                    f'[[services]]\nname = "two"\ngroup = "cg3"\naddress = "h:2"\n{second}\n')
    if not refused:
        load(path, {})
        return
    with pytest.raises(ConfigError, match="the autonomous services 'one' and 'two' may both "
                                          "observe events of type"):
        load(path, {})
