"""What an operator meets in the first hour: `evamed status` against a live mediator, `serve
--check`, shell completion, `--quiet`, tables that never cut an identifier, one spelling of a
clock constituent, a saved token, the TLS recipe of docs/operations.md and the error a client
on the wrong side of TLS gets, the example configuration of docs/operations.md accepting the
project's own profiles, and counts in words ("1 profile")."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from eva.events import parse_time
from eva.parser import parse
from mediator import credentials
from mediator.cli import app
from mediator.cli.common import print_table
from mediator.client import MediatorClient, MediatorError, Notification
from mediator.config import Config, Limits, Tls, load
from mediator.security import add_client
from mediator.server import Running, serve
from mediator.service import Refusal, check_shape
from mediator.store.sqlite import SqliteStore
from tests.test_service_e2e import EVAMED

ROOT = Path(__file__).resolve().parents[1]
OPERATIONS = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
PROFILE = ('class A = type == "a"\nclass B = type == "b"\n'
           "profile S = ((all_dup(A); all_dup(B))_5s)_all_pairs\n")
runner = CliRunner()


def event(ident: str, kind: str, second: int) -> dict[str, str]:
    return {"specversion": "1.0", "id": ident, "source": "urn:test", "type": kind,
            "time": f"2026-03-02T10:00:{second:02d}Z"}


@pytest.fixture
def saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Credentials saved under the test's directory, not the user's."""
    file = tmp_path / "credentials.toml"
    monkeypatch.setenv(credentials.ENV, str(file))
    monkeypatch.delenv("EVAMED_TOKEN", raising=False)
    return file


@pytest.fixture
def mediator(tmp_path: Path) -> Iterator[tuple[Running, str]]:
    """A real mediator (the in-process composer, no services) and alice's token."""
    store = SqliteStore(tmp_path / "m.db")
    token = add_client(store, "alice", operator=True)  # publishes anywhere, advances the clock
    running = serve(Config(listen="127.0.0.1:0", limits=Limits(rate=0)), store=store)
    try:
        yield running, token
    finally:
        running.stop(0.5)
        store.close()


# ------------------------------------------------------------------ status


def test_status_shows_health_inputs_subscriptions_lag_and_dead_letters(
        mediator: tuple[Running, str]) -> None:
    running, token = mediator
    address = f"127.0.0.1:{running.port}"
    with MediatorClient(address, token) as client:
        client.add_profile(PROFILE, name="seq")
        sent = [event("a1", "a", 1), event("b1", "b", 3), event("a1", "a", 4)]  # a duplicate
        assert client.publish(sent, advance_to=parse_time("2026-03-02T10:01:00Z")
                              ).dead_lettered == 1
        # The composite is in the log before its counters move: the lag is set on the loop
        # once the pipeline's append is handed over, composites_out just after the append.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            found = client.status()
            if found.composites_out >= 1 and [s.lag for s in found.subscriptions] == [1]:
                break
            time.sleep(0.05)
    assert found.health == "SERVING" and found.composer == "inprocess"
    assert found.version.startswith("evamed ")
    assert [(i.name, i.position, i.head) for i in found.inputs] == [("mediator", 2, 2)]
    assert found.inputs[0].watermark_us == parse_time("2026-03-02T10:01:00Z")
    (sub,) = found.subscriptions
    assert (sub.name, sub.profiles, sub.log_head, sub.lag) == ("seq", ("S",), 1, 1)  # unread
    assert sub.composers == {"S": "inprocess"}
    assert found.dead_letters == {"duplicate": 1} and found.events_in == {"publish": 2}
    assert found.composites_out == 1 and found.subscriptions_total == 1

    text = runner.invoke(app, ["status", "--server", address, "--token", token],
                         env={"COLUMNS": "60"})
    assert text.exit_code == 0, text.output
    out = text.stdout
    assert re.search(rf"mediator {address}: SERVING — evamed .*, composer inprocess, up ", out)
    assert "event log: 2 events; since the start: 2 events accepted, 1 dead letter, 1 composite" \
        in out
    assert re.search(r"\n mediator +2026-\d\d-\d\dT\d\d:\d\d:\d\dZ +\S+", out), out
    assert re.search(r"\n seq +S +1–1 +1 +inprocess", out), out
    assert "dead letters since the start: duplicate 1" in out
    as_json = runner.invoke(app, ["status", "--format", "json", "--server", address,
                                  "--token", token])
    assert json.loads(as_json.stdout)["dead_letters"] == {"duplicate": 1}


def test_status_of_a_mediator_whose_pipeline_stopped_says_why_and_exits_1(
        mediator: tuple[Running, str]) -> None:
    running, token = mediator
    running.served.pipeline.error = RuntimeError("the store went away")
    result = runner.invoke(app, ["status", "--server", f"127.0.0.1:{running.port}", "--token",
                                 token])
    assert result.exit_code == 1, result.output
    assert ": NOT_SERVING — " in result.stdout
    assert "the pipeline stopped: the store went away" in result.stdout


# ------------------------------------------------------------------ serve --check


def test_serve_check_says_what_would_run_and_refuses_what_cannot(tmp_path: Path) -> None:
    ok = runner.invoke(app, ["serve", "--check", "--store", f"sqlite:///{tmp_path}/m.db"])
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.startswith("configuration the defaults: the mediator would start with it\n")
    assert "composer inprocess" in ok.stdout and "no services" in ok.stdout
    assert not (tmp_path / "m.db").exists()  # checked, not opened
    config = tmp_path / "m.toml"
    config.write_text('[tls]\ncert = "nothing.pem"\nkey = "nothing.key"\n')
    bad = runner.invoke(app, ["serve", "--check", "--config", str(config)])
    assert bad.exit_code == 2 and "tls.cert nothing.pem / tls.key nothing.key" in bad.output
    gone = runner.invoke(app, ["serve", "--check", "--store", f"sqlite:///{tmp_path}/no/m.db"])
    assert gone.exit_code == 2 and f"the directory {tmp_path}/no does not exist" in gone.output


# ------------------------------------------------------------------ completion, --quiet


def test_shell_completion_completes_commands() -> None:
    out = subprocess.run([EVAMED], env={**os.environ, "_EVAMED_COMPLETE": "complete_bash",
                                        "COMP_WORDS": "evamed sta", "COMP_CWORD": "1"},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["status"], out.stdout + out.stderr
    # The script --show-completion prints for bash (it detects the shell from the process
    # tree, which under pytest may hold none).
    script = subprocess.run([EVAMED], env={**os.environ, "_EVAMED_COMPLETE": "source_bash"},
                            capture_output=True, text=True, timeout=60)
    assert "_evamed_completion" in script.stdout


def test_quiet_leaves_the_output_and_the_errors(tmp_path: Path, saved: Path) -> None:
    store = f"sqlite:///{tmp_path}/m.db"
    loud = subprocess.run([EVAMED, "clients", "add", "bob", "--store", store],
                          capture_output=True, text=True, timeout=60)
    assert "client bob added" in loud.stderr and loud.stdout.startswith("evm_")
    quiet = subprocess.run([EVAMED, "-q", "clients", "add", "carol", "--store", store],
                           capture_output=True, text=True, timeout=60)
    assert quiet.stderr == "" and quiet.stdout.startswith("evm_")
    refused = subprocess.run([EVAMED, "--quiet", "clients", "add", "carol", "--store", store],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "error:" in refused.stderr


# ------------------------------------------------------------------ tables


def test_a_table_never_cuts_a_word_however_narrow_the_terminal() -> None:
    for width in (30, 60, 100):
        console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
        table = Table("name", "profiles", "plans")
        table.add_row("BackInTimeForTheWholeFleet", "warehouse_service_of_the_north",
                      "BackInTime: decompose, mediator, warehouse_service_of_the_north")
        print_table(table, console)
        text = console.export_text()
        for word in ("BackInTimeForTheWholeFleet", "warehouse_service_of_the_north",
                     "decompose,", "mediator,"):
            assert word in text, (width, text)
        assert "…" not in text


def test_check_says_one_profile_and_never_cuts_its_name(tmp_path: Path) -> None:
    path = tmp_path / "one.eva"
    path.write_text('class Depart = type == "truck.departure"\n'
                    "profile TheOneProfileWithAVeryLongName = Depart\n")
    result = runner.invoke(app, ["check", str(path)], env={"COLUMNS": "40"})
    assert result.exit_code == 0, result.output
    assert f"{path}: 1 class, 1 profile" in result.stdout
    assert "TheOneProfileWithAVeryLongName" in result.stdout


# ------------------------------------------------------------------ clock constituents


def test_a_tick_is_spelled_by_its_id_in_replay_and_subscribe(tmp_path: Path) -> None:
    """One spelling: ``tick:NAME@TIME``, the id the composite carries (data.constituents) —
    which its deterministic id hashes, so it cannot change — in replay's output, subscribe's
    table, compact and expanded forms, and the demo. ``eva.tick.NAME`` is the type under which
    a base service is sent ticks, never how a constituent is shown."""
    from mediator.cli.subscribe import _compact, _described, _events

    profiles = tmp_path / "p.eva"
    profiles.write_text('class L = type == "l"\nclass Half = every 30min\n'
                        "profile P = ((last_dup(L); all_dup(Half))_30min)_all_pairs\n")
    events = tmp_path / "e.jsonl"
    events.write_text(json.dumps({**event("l1", "l", 0), "time": "2026-03-02T10:10:00Z"}) + "\n"
                      + json.dumps({**event("l2", "l", 0), "time": "2026-03-02T11:00:00Z"}) + "\n")
    out = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", str(events)])
    constituents = json.loads(out.stdout.splitlines()[0])["data"]["constituents"]
    assert constituents == ["l1", "tick:Half@2026-03-02T10:30:00Z"]
    note = Notification({"time": "2026-03-02T10:30:00Z", "data": {"constituents": constituents}},
                        "c1", "P", "p", ("urn:test", "urn:evamed:clock"), ("mediator",), "t",
                        ("l", "eva.tick.Half"), (1_772_446_200_000_000, 1_772_447_400_000_000))
    assert _described(note) == ["l@urn:test 2026-03-02T10:10:00Z",
                                "tick:Half@2026-03-02T10:30:00Z"]
    assert _events(note)[1] == {"id": "tick:Half@2026-03-02T10:30:00Z"}
    assert "tick:Half@2026-03-02T10:30:00Z" in _compact(note, expand=True)
    from mediator.demo import Seen, _row

    console = Console(width=100, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    _row(note, Seen(), console)
    assert "tick:Half@2026-03-02T10:30:00Z" in console.export_text()
    assert "eva.tick" not in console.export_text()


# ------------------------------------------------------------------ tokens


def test_a_saved_token_is_the_default_of_the_commands_and_the_client(
        mediator: tuple[Running, str], saved: Path) -> None:
    running, token = mediator
    address = f"127.0.0.1:{running.port}"
    with pytest.raises(ValueError, match=r"no token for .*clients add NAME --save"):
        MediatorClient(address)
    missing = runner.invoke(app, ["profile", "list", "--server", address])
    assert missing.exit_code == 2 and "save one with `evamed clients add NAME --save`" in \
        missing.output
    assert credentials.save(address, "alice", token) == saved
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert tomllib.loads(saved.read_text())[address] == {"client": "alice", "token": token}
    listed = runner.invoke(app, ["profile", "list", "--server", address])
    assert listed.exit_code == 0, listed.output
    with MediatorClient(address) as client:
        assert client.profiles() == []


def test_clients_add_save_keeps_the_token_for_the_configured_address(
        tmp_path: Path, saved: Path) -> None:
    config = tmp_path / "m.toml"
    config.write_text(f'listen = "0.0.0.0:7001"\nstore = "sqlite:///{tmp_path}/m.db"\n')
    result = runner.invoke(app, ["clients", "add", "dave", "--config", str(config), "--save"])
    assert result.exit_code == 0, result.output
    assert credentials.token_for("127.0.0.1:7001") == result.stdout.strip()


# ------------------------------------------------------------------ TLS


def _recipe(name: str) -> str:
    found = re.search(rf"<!-- recipe: {name} -->\n```sh\n(.*?)```", OPERATIONS, re.S)
    assert found is not None
    return found.group(1)


def test_the_tls_recipe_makes_what_the_mediator_serves_and_clients_trust(tmp_path: Path) -> None:
    """docs/operations.md's openssl lines, run as written; the mediator serves TLS with them;
    a client with the CA is answered, one without is told at once that TLS is required, and a
    TLS client of a plaintext mediator that it speaks plaintext."""
    subprocess.run(["bash", "-e", "-c", _recipe("tls")], cwd=tmp_path, check=True,
                   capture_output=True, timeout=120)
    checked = runner.invoke(app, ["serve", "--check", "--store", f"sqlite:///{tmp_path}/c.db"],
                            env={"EVAMED_TLS_CERT": str(tmp_path / "server.pem"),
                                 "EVAMED_TLS_KEY": str(tmp_path / "server.key")})
    assert checked.exit_code == 0 and "(TLS)" in checked.stdout, checked.output
    store = SqliteStore(tmp_path / "m.db")
    token = add_client(store, "alice")
    tls = Tls(str(tmp_path / "server.pem"), str(tmp_path / "server.key"))
    secure = serve(Config(listen="127.0.0.1:0", tls=tls), store=store)
    plain = serve(Config(listen="127.0.0.1:0"), store=store)
    try:
        for host in ("127.0.0.1", "localhost"):
            with MediatorClient(f"{host}:{secure.port}", token,
                                tls_ca=tmp_path / "ca.pem") as client:
                assert client.profiles() == []
        started = time.monotonic()
        with pytest.raises(MediatorError, match=r"the mediator at 127\.0\.0\.1:\d+ requires TLS: "
                                                r"give the CA file"):
            MediatorClient(f"127.0.0.1:{secure.port}", token).profiles()
        assert time.monotonic() - started < 5  # not the call's 10 s
        with pytest.raises(MediatorError, match="speaks plaintext, not TLS"):
            MediatorClient(f"127.0.0.1:{plain.port}", token, tls_ca=tmp_path / "ca.pem").profiles()
        cli = runner.invoke(app, ["profile", "list", "--server", f"127.0.0.1:{secure.port}",
                                  "--token", token])
        assert cli.exit_code == 1 and "requires TLS" in cli.output
    finally:
        secure.stop(0.5)
        plain.stop(0.5)
        store.close()


# ------------------------------------------------------------------ the example configuration


def test_the_example_configuration_accepts_the_projects_profiles(tmp_path: Path) -> None:
    """docs/operations.md's example, as written, loads; its limits accept the paper's profiles
    and the README's; and the limit it mentions (time_frame) refuses P3 in a sentence."""
    found = re.search(r"<!-- example: configuration -->\n```toml\n(.*?)```", OPERATIONS, re.S)
    assert found is not None
    path = tmp_path / "mediator.toml"
    path.write_text(found.group(1))
    config = load(path, environ={})
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    late = re.search(r"cat > late.eva <<'PROFILE'\n(.*?)PROFILE", readme, re.S)
    assert late is not None
    for text in ((ROOT / "examples" / "logistics" / "profiles.eva").read_text(), late.group(1)):
        check_shape(parse(text), config.limits)
    with pytest.raises(Refusal) as refused:
        check_shape(parse((ROOT / "examples" / "logistics" / "profiles.eva").read_text()),
                    Limits(time_frame=30 * 86_400_000_000))
    assert str(refused.value) == ("profile P3 has an unbounded time frame (_inf); expected time "
                                  "frames of at most 30d (limits.time_frame)")
    assert str(refused.value) in found.group(1).replace("\n# ", " ").replace('"', "")


@pytest.mark.xdist_group("service")
def test_status_shows_an_autonomous_service_with_its_watermark_and_queries(
        tmp_path: Path) -> None:
    """A base service with a producer of its own: status names it autonomous and SERVING with
    its native query, and its input with the watermark its producer's events gave it and the
    link-log positions the pipeline has read."""
    from adapters.client import BaseClient
    from eva.events import from_cloudevent
    from mediator.config import ServiceConfig
    from tests.test_service_e2e import Process

    service = Process("base-service", "--group", "cg2", "--listen", "127.0.0.1:0")
    store = SqliteStore(tmp_path / "m.db")
    token = add_client(store, "alice")
    config = Config(listen="127.0.0.1:0", services=(ServiceConfig(
        "fleet", "cg2", service.address, types=("truck.*",)),))
    running = serve(config, store=store)
    try:
        address = f"127.0.0.1:{running.port}"
        with MediatorClient(address, token) as client:
            client.add_profile('class D = type == "truck.departure"\nprofile P = D\n')
            producer = BaseClient(service.address)
            try:
                producer.publish([from_cloudevent(event("d1", "truck.departure", 5), 1)],
                                 advance_to=parse_time("2026-03-02T10:00:10Z"))
            finally:
                producer.close()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                found = client.status()
                fleet = {i.name: i for i in found.inputs}["fleet"]
                if fleet.watermark_us >= parse_time("2026-03-02T10:00:05Z") and fleet.head:
                    break
                time.sleep(0.1)
        assert [i.name for i in found.inputs] == ["mediator", "fleet"]
        assert fleet.watermark_us >= parse_time("2026-03-02T10:00:05Z"), fleet
        (listed,) = found.services
        assert (listed.name, listed.mode, listed.status, listed.subscriptions) == (
            "fleet", "autonomous", "SERVING", 1)
        shown = runner.invoke(app, ["status", "--server", address, "--token", token])
        assert re.search(r"\n fleet +autonomous +cg2 +127\.0\.0\.1:\d+ +SERVING +1", shown.stdout)
    finally:
        running.stop(0.5)
        store.close()
        service.stop()
