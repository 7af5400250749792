"""The live demo's world: the paper's logistics scenario (EVA §3.1) spread over five base
services and an MQTT broker, and the mediator's configuration that connects them.

* The trucks report their location over MQTT (topic ``trucks/<truck>/location``, the payload's
  own id and time): the broker is a source of the mediator (a CG-0 service).
* Everything else reaches the mediator through ``Publish`` — traffic control, the fleet's
  dispatch, the warehouse, the order desk — and each kind of event is observed by the base
  service of one language group, as a company's existing event services would be: traffic jams
  by a boolean filter service (CG-1), departures and arrivals by a Snoop service (CG-2), goods
  by a streaming-SQL service (CG-3), orders by an XChange service (CG-4), and a peer EVA
  mediator (CG-5) that watches the fleet and the warehouse too.
* Four clients subscribe the paper's profiles: a controller (P1, P4, P5, P6), an analyst (P2),
  customer I (P3) and the order desk (P7).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

MQTT_TYPE = "truck.location"
BROKER = "fleet-radio"


@dataclass(frozen=True)
class Service:
    name: str
    group: str
    types: tuple[str, ...]
    what: str


SERVICES = (
    Service("traffic", "cg1", ("traffic.*",), "traffic control's boolean filters"),
    Service("fleet", "cg2", ("truck.departure", "truck.arrival"), "the fleet's Snoop rules"),
    Service("warehouse", "cg3", ("goods.*",), "the warehouse's streaming SQL"),
    Service("orders", "cg4", ("order.*",), "the order desk's XChange queries"),
    Service("peer", "cg5", ("truck.*", "goods.*"), "a peer EVA mediator over fleet and goods"),
)
"""In the configured order: on a tie the planner takes the earlier (the peer comes last, so it
gets what only it can evaluate whole)."""

CLIENTS = {
    "controller": ("P1", "P4", "P5", "P6"),
    "analyst": ("P2",),
    "customer-i": ("P3",),
    "order-desk": ("P7",),
}


def documents(profiles_text: str) -> dict[str, str]:
    """Each profile of the paper's file as a document of its own (the classes, and it)."""
    lines = profiles_text.splitlines()
    classes = [line for line in lines if line.startswith("class ")]
    return {line.split()[1]: "\n".join([*classes, line]) + "\n"
            for line in lines if line.startswith("profile ")}


def config(workdir: Path, mqtt_port: int, services: dict[str, str], composer: str,
           metrics_port: int) -> str:
    """The mediator's configuration: SQLite in the work directory, the composer, the five
    services at their addresses, the broker with its mapping."""
    parts = ['listen = "127.0.0.1:0"', f'store = "sqlite://{workdir / "evamed.db"}"',
             f'composer = "{composer}"', f"metrics_port = {metrics_port}", 'log_level = "WARNING"',
             "", "[limits]", "rate = 0"]
    for s in SERVICES:
        parts += ["", "[[services]]", f'name = "{s.name}"', f'group = "{s.group}"',
                  f'address = "{services[s.name]}"', f"types = {json.dumps(list(s.types))}"]
    parts += ["", "[[sources]]", f'name = "{BROKER}"', 'kind = "mqtt"', 'host = "127.0.0.1"',
              f"port = {mqtt_port}", "", "[[sources.rules]]",
              'topic = "trucks/+truck/location"', f'type = "{MQTT_TYPE}"',
              'source = "mqtt://{broker}/{truck}"', 'time = {field = "time", format = "rfc3339"}',
              'id = {field = "id"}']
    return "\n".join(parts) + "\n"


def mqtt_message(event: dict[str, Any]) -> tuple[str, bytes]:
    """A truck's location report as its radio sends it: the topic names the truck."""
    body = {"id": event["id"], "time": event["time"], **event["data"]}
    return f"trucks/{event['data']['truck']}/location", json.dumps(body).encode()


def runs(events: list[dict[str, Any]]) -> list[tuple[bool, list[dict[str, Any]]]]:
    """The day in time order as runs of (over MQTT, events): the mediator takes events in time
    order, so each run is in before the next one starts."""
    return [(mqtt, list(group)) for mqtt, group in
            groupby(events, key=lambda e: e["type"] == MQTT_TYPE)]
