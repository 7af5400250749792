"""The live demo's world: the paper's logistics scenario (EVA §3.1) as a federation of a
company's existing event services — each with its own producers — and an MQTT broker, and the
mediator's configuration that connects them.

* The trucks report their location over MQTT (topic ``trucks/<truck>/location``, the payload's
  own id and time): the broker is a source of the mediator — its own feed (CG-0).
* Every other event is published by its own producer **to its own service**, never to the
  mediator: traffic control's jams to a boolean filter service (CG-1), the fleet's departures
  and arrivals to a Snoop service (CG-2), the warehouse's deliveries to a streaming-SQL service
  (CG-3), the order desk's cancellations to an XChange service (CG-4), and the loading dock's
  pickups to a peer EVA mediator (CG-5). The mediator only subscribes there (autonomous
  services) and composes what they report.
* Four clients subscribe the paper's profiles and one more: a controller (P1, P4, P5, P6), an
  analyst (P2), customer I (P3) and the order desk (P7, and P8: a delivery to a customer who
  cancelled that day — the warehouse's and the order desk's events composed at the mediator).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fnmatch import fnmatchcase
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
    Service("warehouse", "cg3", ("goods.delivery",), "the warehouse's streaming SQL"),
    Service("orders", "cg4", ("order.*",), "the order desk's XChange queries"),
    Service("dock", "cg5", ("goods.pickup",), "the loading dock's peer EVA mediator"),
)
"""In the configured order (each one's rank in the merged trace). Each observes the events its
own producers publish to it (disjoint types)."""

CLIENTS = {
    "controller": ("P1", "P4", "P5", "P6"),
    "analyst": ("P2",),
    "customer-i": ("P3",),
    "order-desk": ("P7", "P8"),
}

EXTRA = {"P8": (
    'class Cancel   = type == "order.cancelled"\n'
    'class Delivery = type == "goods.delivery"\n'
    "# P8 (order desk): a delivery to a customer who cancelled within the day before.\n"
    "profile P8 per data.customer = ((all_dup(Cancel); all_dup(Delivery))_1d)_all_pairs\n")}
"""The demo's one profile beyond the paper's: a composite across two services."""


def service_of(event: dict[str, Any]) -> Service | None:
    """The service whose producers publish ``event`` (None: the trucks' radio, over MQTT)."""
    return next((s for s in SERVICES
                 if any(fnmatchcase(event["type"], t) for t in s.types)), None)


def documents(profiles_text: str) -> dict[str, str]:
    """Each profile of the paper's file as a document of its own (the classes, and it), and
    the demo's own (:data:`EXTRA`)."""
    lines = profiles_text.splitlines()
    classes = [line for line in lines if line.startswith("class ")]
    return {**{line.split()[1]: "\n".join([*classes, line]) + "\n"
               for line in lines if line.startswith("profile ")}, **EXTRA}


def config(workdir: Path, mqtt_port: int, services: dict[str, str], composer: str,
           metrics_port: int) -> str:
    """The mediator's configuration: SQLite in the work directory, the composer, the five
    autonomous services at their addresses (each with a long idle timeout: the day is played in
    time order, a quiet service holds nothing back wrongly), the broker with its mapping."""
    parts = ['listen = "127.0.0.1:0"', f'store = "sqlite://{workdir / "evamed.db"}"',
             f'composer = "{composer}"', f"metrics_port = {metrics_port}", 'log_level = "WARNING"',
             'idle_timeout = "2s"', "", "[limits]", "rate = 0"]
    for s in SERVICES:
        parts += ["", "[[services]]", f'name = "{s.name}"', f'group = "{s.group}"',
                  f'address = "{services[s.name]}"', f"types = {json.dumps(list(s.types))}",
                  'mode = "autonomous"', 'idle_timeout = "60s"']
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
