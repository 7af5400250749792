"""The live demo (``evamed demo``, ``make demo``): the whole system on one machine, as a
newcomer first sees it.

It starts mosquitto, the five base services — each a company service with producers of its
own — and ``evamed serve`` (SQLite store, the Spark composer by default), registers the
paper's profiles P1–P7 and one more for four clients, and plays the logistics day (EVA §3.1)
in time order, compressed into about half a minute: the trucks' location reports over MQTT to
the mediator, every other event published by its producer to its own service — the mediator
never receives those. Each composite is shown as it arrives, with its contributing events
(type, source, time), the services they came through and what the mediator did (composed it,
post-filtered it, or took it as the service reported it); then a summary, a check that every
service a plan assigns took part, and a check that the composites are exactly what ``evamed
replay`` computes over the merged trace of all producers. Everything it started is stopped at
the end, also after Ctrl-C.

Modules: :mod:`mediator.demo.scenario` (who observes what, the configuration),
:mod:`mediator.demo.processes` (starting and stopping the servers), here the run and its
display.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mediator.cli.common import print_table
from mediator.demo.processes import Child, DemoError, Stack, Stopped, evamed, free_port, mosquitto
from mediator.demo.scenario import (
    BROKER,
    CLIENTS,
    SERVICES,
    config,
    documents,
    mqtt_message,
    runs,
    service_of,
)

LOGISTICS = Path(__file__).resolve().parents[2] / "examples" / "logistics"
PROFILES = LOGISTICS / "profiles.eva"


def _day(seed: int) -> list[dict[str, Any]]:
    """The scenario's generator (examples/logistics/generate.py), loaded from the source tree:
    the demo plays the examples, which are not part of the installed package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("evamed_demo_day", LOGISTICS / "generate.py")
    if spec is None or spec.loader is None or not PROFILES.exists():
        raise DemoError(f"the logistics example is not at {LOGISTICS}: run the demo from a "
                        "source checkout (make demo)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    events: list[dict[str, Any]] = module.day(seed)
    return events


@dataclass
class Seen:
    """What the demo has received and counted."""

    composites: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by profile
    services: dict[str, tuple[str, ...]] = field(default_factory=dict)  # composite id → services
    plans: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # profile → kind, services
    published: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # service → events


def run(workdir: Path, *, composer: str = "spark", seconds: float = 30.0,
        console: Console | None = None, seed: int = 7) -> bool:
    """The demo in ``workdir`` (logs, configuration, store). True when the live composites
    equal replay's."""
    console = console or Console(highlight=False)
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    events = _day(seed)
    stack = Stack()
    clients: list[Any] = []
    try:
        mediator, services, metrics, mqtt_port = _start(stack, workdir, logs, composer, console)
        seen = Seen()
        clients, notes = _subscribe(workdir, mediator, console, seen)
        _play(events, mqtt_port, metrics, clients[0][1], services, seconds, console, notes, seen)
        return _check(workdir, metrics, notes, seen, console, clients[0][1])
    finally:
        try:
            for _, client in clients:
                client.close()
        finally:  # a second signal kills what is left (Stack.stop) and ends the demo
            with console.status("stopping everything the demo started"):
                stack.stop()
            console.print(f"[dim]logs and the store are in {workdir}[/]", soft_wrap=True)


# ---------------------------------------------------------------- start


def _start(stack: Stack, workdir: Path, logs: Path, composer: str,
           console: Console) -> tuple[Child, dict[str, str], int, int]:
    with console.status("starting mosquitto and the five base services"):
        mqtt_port = mosquitto(workdir, logs, stack)
        started = {s.name: stack.add(Child(f"base-{s.name}", [
            evamed(), "base-service", "--group", s.group, "--listen", "127.0.0.1:0",
            "--data", str(workdir / f"base-{s.name}")], logs)) for s in SERVICES}
        addresses = {name: child.serving(60) for name, child in started.items()}
    console.print("services (each with producers of its own: the mediator only subscribes "
                  "there)", soft_wrap=True)
    table = Table(box=None)
    for column in ("name", "group", "its producers publish", "what"):
        table.add_column(column)
    for s in SERVICES:
        table.add_row(s.name, s.group.upper(), ", ".join(s.types), s.what)
    table.add_row(BROKER, "CG0", "truck.location", "the trucks' radio, MQTT at "
                  f"127.0.0.1:{mqtt_port} (topics trucks/<truck>/location): the mediator's "
                  "own feed")
    print_table(table, console)
    metrics = free_port()
    path = workdir / "mediator.toml"
    path.write_text(config(workdir, mqtt_port, addresses, composer, metrics), encoding="utf-8")
    title = f"starting the mediator (composer: {composer})"
    with console.status(title) as status:
        mediator = stack.add(Child("mediator", [evamed(), "serve", "--config", str(path)], logs))
        mediator.serving(400, lambda step: status.update(f"{title}: {escape(step)}"))
    console.print(f"mediator serving on {mediator.address} (configuration {path}, composer "
                  f"{composer}, metrics on :{metrics})", soft_wrap=True)
    return mediator, addresses, metrics, mqtt_port


# ---------------------------------------------------------------- subscribe


Notes = queue.Queue[tuple[str, Any]]


def _subscribe(workdir: Path, mediator: Child, console: Console,
               seen: Seen) -> tuple[list[Any], Notes]:
    """Each client registers its profiles and tails them, a thread per subscription."""
    from mediator.client import MediatorClient

    docs = documents(PROFILES.read_text(encoding="utf-8"))
    notes: Notes = queue.Queue()
    clients = []
    plans = Table(box=None)
    for column in ("client", "profile", "plan: kind, services"):
        plans.add_column(column)
    for name, profiles in CLIENTS.items():
        # Operators: one of them says when the day is over (advance_to_us is an operator's).
        token = subprocess.run([evamed(), "clients", "add", name, "--operator", "--config",
                                str(workdir / "mediator.toml")], capture_output=True, text=True,
                               check=True).stdout.strip()
        client = MediatorClient(mediator.address, token)
        clients.append((name, client))
        for profile in profiles:
            info = client.add_profile(docs[profile], name=profile)
            kind, *services = info.plans[0].split(": ", 1)[1].split(", ")
            seen.plans[profile] = (kind, services)
            plans.add_row(name, profile, "; ".join(p.split(": ", 1)[1] for p in info.plans))
            threading.Thread(target=_tail, args=(client, profile, notes), daemon=True,
                             name=f"demo-{profile}").start()
    console.print("subscriptions and their plans")
    print_table(plans, console)
    return clients, notes


def _tail(client: Any, name: str, notes: Notes) -> None:
    try:
        for note in client.subscribe(name=name):
            notes.put(("composite", note))
    except Exception as exc:  # the stream ends when the demo closes its client
        notes.put(("ended", f"{name}: {exc}"))


# ---------------------------------------------------------------- play the day


def _play(events: list[dict[str, Any]], mqtt_port: int, metrics: int, client: Any,
          services: dict[str, str], seconds: float, console: Console, notes: Notes,
          seen: Seen) -> None:
    """The day in time order, compressed into ``seconds``: the trucks' reports through the
    broker (waited for until the mediator has taken them), every other event by its producer
    to its own service's Publish; each composite printed as it comes. At the end each producer
    says the day is over (its service's clock moves to the day's last instant, and so does the
    mediator's own feed's)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from adapters.client import BaseClient
    from eva.events import from_cloudevent, parse_time

    radio = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="demo-trucks")
    radio.connect("127.0.0.1", mqtt_port)
    radio.loop_start()
    producers = {name: BaseClient(address) for name, address in services.items()}
    first, last = parse_time(events[0]["time"]), parse_time(events[-1]["time"])
    began = time.monotonic()
    sent = 0
    console.rule(f"the day {events[0]['time'][:10]}: {len(events)} events, "
                 f"{events[0]['time'][11:16]}–{events[-1]['time'][11:16]} in ~{seconds:.0f} s")
    said = first  # each producer has said no event before this will come from it
    try:
        for over_mqtt, batch in runs(events):
            at = parse_time(batch[0]["time"])
            due = began + seconds * (at - first) / max(1, last - first)
            _show(notes, seen, console, until=due)
            if at - said >= ADVANCE_EVERY:
                # Time passes for every producer, also one with nothing to publish: its service
                # learns it (a watermark), so plans that wait on it need not wait for its next
                # event — or for its idle timeout.
                for producer in producers.values():
                    producer.publish([], advance_to=at - 1)
                said = at
            if over_mqtt:
                for event in batch:
                    radio.publish(*mqtt_message(event), qos=1).wait_for_publish(10)
                sent += len(batch)
                _taken(metrics, sent, notes, seen, console)
                continue
            for event in batch:  # each producer to its own service, in the day's order
                service = service_of(event)
                assert service is not None
                reply = producers[service.name].publish([from_cloudevent(event)])
                if reply.rejected:
                    console.print(f"[red]{service.name} refused[/]: {list(reply.errors)}")
                seen.published.setdefault(service.name, []).append(event)
        for producer in producers.values():  # the day is over: decide what waits on the clock
            producer.publish([], advance_to=last)
        client.publish([], advance_to=last)
    finally:
        radio.loop_stop()
        radio.disconnect()
        for producer in producers.values():
            producer.close()


def _taken(metrics: int, count: int, notes: Notes, seen: Seen,
           console: Console) -> None:
    """Wait until the mediator has taken ``count`` events in all (accepted or refused)."""
    deadline = time.monotonic() + 30
    while _metric(metrics, "evamed_events_in_total") + _metric(
            metrics, "evamed_dead_letters_total") < count:
        if time.monotonic() > deadline:
            raise DemoError("the mediator did not take the trucks' MQTT reports within 30 s "
                            "(logs/mediator.log)")
        _show(notes, seen, console, until=time.monotonic() + 0.02)


def _metric(port: int, name: str) -> float:
    """A counter summed over its labels."""
    return sum(_metrics(port, name).values())


def _metrics(port: int, name: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name):
            label, _, value = line.rpartition(" ")
            found = re.search(r'="([^"]*)"', label)
            out[found.group(1) if found else ""] = float(value)
    return out


def _show(notes: Notes, seen: Seen, console: Console,
          until: float) -> None:
    """Print the composites that arrive until the monotonic time ``until``."""
    while True:
        wait = until - time.monotonic()
        try:
            kind, item = notes.get(timeout=max(0.0, wait)) if wait > 0 else notes.get_nowait()
        except queue.Empty:
            return
        if kind == "composite":
            _row(item, seen, console)


ADVANCE_EVERY = 5 * 60_000_000
"""How far the day moves (µs) before the producers say so to their services again."""

COLOURS = {"P1": "red", "P2": "magenta", "P3": "yellow", "P4": "green", "P5": "cyan",
           "P6": "blue", "P7": "bright_magenta", "P8": "bright_green"}


def _row(note: Any, seen: Seen, console: Console) -> None:
    """A composite as a line (its time, profile, partition, services) and a line per
    contributing event — narrow enough for an 80-column terminal."""
    body = note.cloudevent
    seen.composites.setdefault(note.profile, []).append(body)
    seen.services[note.id] = note.services
    colour = COLOURS.get(note.profile, "white")
    partition = body["data"].get("partition")
    per = f" {escape(json.dumps(partition))}" if partition is not None else ""
    through = ", ".join(dict.fromkeys(note.services))
    kind = seen.plans.get(note.profile, ("", []))[0]
    did = {"decompose": "composed at the mediator", "positive": "post-filtered at the mediator",
           }.get(kind, "as the service reported it")
    lines = [f"{body['time'][11:19]}  [bold {colour}]{escape(note.profile)}[/]{per}  "
             f"[dim]through {escape(through)}; {did}[/]"]
    from eva.events import format_time

    # What the mediator says of each contributing event (Notification.types, sources, times_us)
    for at, ident in enumerate(body["data"]["constituents"]):
        kind = note.types[at] if at < len(note.types) else ""
        when = format_time(note.times_us[at])[11:19] if at < len(note.times_us) else ""
        if kind.startswith("eva.tick.") or kind == "absence" or not kind:
            # the clock's constituents by their id, as replay and subscribe show them
            lines.append(f"          [cyan]{escape(ident)}[/]")
            continue
        source = note.sources[at] if at < len(note.sources) else "?"
        lines.append(f"          {escape(kind)}  [dim]{escape(source)}[/]  {when}")
    console.print("\n".join(lines), soft_wrap=True)


# ---------------------------------------------------------------- check


def _check(workdir: Path, metrics: int, notes: Notes,
           seen: Seen, console: Console, client: Any) -> bool:
    """Wait for what replay computes over the merged trace, then compare and summarise."""
    from rich.status import Status

    expected = _replayed(workdir / "evamed.db", seen.published)
    want = sum(len(v) for v in expected.values())
    deadline = time.monotonic() + 120
    with Status("waiting for the last composites", console=console):
        while (sum(len(v) for v in seen.composites.values()) < want
               and time.monotonic() < deadline):
            _show(notes, seen, console, until=time.monotonic() + 0.2)
    _show(notes, seen, console, until=time.monotonic() + 1.0)  # nothing more comes
    console.rule("summary")
    inflow = _metrics(metrics, "evamed_events_in_total")
    letters = _metrics(metrics, "evamed_dead_letters_total")
    table = Table(box=None)
    for column in ("profile", "composites", "replay", "equal"):
        table.add_column(column)
    equal = True
    for profile in sorted(set(expected) | set(seen.composites)):
        got = sorted(json.dumps(c, sort_keys=True) for c in seen.composites.get(profile, []))
        ref = sorted(json.dumps(c, sort_keys=True) for c in expected.get(profile, []))
        equal &= got == ref
        table.add_row(profile, str(len(got)), str(len(ref)),
                      "[green]yes[/]" if got == ref else "[red]NO[/]")
    print_table(table, console)
    console.print("events in, by source: " + ", ".join(
        f"{source} {int(n)}" for source, n in sorted(inflow.items())))
    console.print("dead letters: " + (", ".join(f"{r} {int(n)}" for r, n in letters.items())
                                      if letters else "none"))
    services = Counter(s for names in seen.services.values() for s in dict.fromkeys(names))
    console.print("composites with events through: " + ", ".join(
        f"{s} {n}" for s, n in services.most_common()))
    assigned = {s for _, named in seen.plans.values() for s in named} - {"mediator"}
    queries = {s.name: s.subscriptions for s in client.services()}
    missing = sorted(s for s in assigned if not queries.get(s))
    if missing:
        console.print(f"[red]✗[/] assigned by a plan, but nothing subscribed there: "
                      f"{', '.join(missing)}", soft_wrap=True)
    else:
        console.print("[green]✓[/] every service a plan assigns is subscribed there (queries: "
                      + ", ".join(f"{s} {queries[s]}" for s in sorted(assigned)) + ")",
                      soft_wrap=True)
    total = sum(len(v) for v in seen.composites.values())
    if equal:
        console.print(f"[green]✓[/] the {total} live composites are exactly what `evamed "
                      "replay` computes over the merged trace of all producers (the mediator "
                      "saw only the trucks' reports and the services' notifications)",
                      soft_wrap=True)
    else:
        console.print(f"[red]✗[/] the live composites ({total}) differ from replay's ({want})")
    return equal and not missing


def _replayed(store: Path, published: dict[str, list[dict[str, Any]]]
              ) -> dict[str, list[dict[str, Any]]]:
    """``evamed replay`` over the merged trace of all producers, by profile: the mediator's
    own feed as it accepted it (the trucks' reports, its event log) and what each producer
    published to its service, each event at its place — by time, then the own feed, then the
    services in the configured order, each in its arrival order."""
    from adapters.federation import merged_seq
    from eva.engine import replay
    from eva.events import from_cloudevent, from_json_line
    from eva.notify import to_cloudevent
    from eva.parser import parse
    from mediator.store.sqlite import SqliteStore

    log = SqliteStore(store)
    try:
        lines: list[str] = []
        while batch := log.read_events(after=len(lines), limit=1000):
            lines.extend(item.line for item in batch)
    finally:
        log.close()
    trace = [from_json_line(line, seq=merged_seq(0, n + 1)) for n, line in enumerate(lines)]
    for rank, service in enumerate(SERVICES, start=1):
        trace += [from_cloudevent(e, merged_seq(rank, n))
                  for n, e in enumerate(published.get(service.name, []))]
    trace.sort(key=lambda e: e.key)
    docs = documents(PROFILES.read_text(encoding="utf-8"))
    out: dict[str, list[dict[str, Any]]] = {}
    for text in docs.values():
        for n in replay(parse(text), trace):
            out.setdefault(n.profile, []).append(to_cloudevent(n))
    return out


__all__ = ["DemoError", "Stopped", "run"]
