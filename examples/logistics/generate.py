"""Generate one day of the logistics scenario (EVA §3.1) as CloudEvents JSON lines.

Deterministic for a given seed. Trucks T1–T3 depart at 08:00, report their location every
5 minutes, pick up goods, deliver along their lists and return; traffic jams happen in area A;
some customers cancel orders. Goods are picked up late (after 12:00), so P5 fires.
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROUTES = {
    "T1": ["A", "B", "I"],
    "T2": ["D", "E", "C"],
    "T3": ["H", "F", "G"],
}
AREAS = {"A": "A", "B": "A", "C": "B", "D": "B", "E": "C", "F": "C", "G": "A", "H": "B", "I": "C"}


def day(seed: int, date: str = "2026-03-02") -> list[dict[str, Any]]:
    rng = random.Random(seed)
    base = datetime.fromisoformat(f"{date}T00:00:00+00:00")
    events: list[tuple[datetime, str, dict[str, Any]]] = []

    def at(hours: float) -> datetime:
        return base + timedelta(seconds=round(hours * 3600))

    for truck, route in ROUTES.items():
        start = 8.0 + rng.random() * 0.25
        events.append((at(start), "truck.departure", {"truck": truck, "location": "garage"}))
        t = start + 0.25
        events.append((at(t), "truck.arrival", {"truck": truck, "location": "warehouse"}))
        t = 12.1 + rng.random() * 0.2  # late loading: nothing picked up between 10:00 and 12:00
        events.append((at(t), "goods.pickup", {"truck": truck, "location": "warehouse"}))
        previous = "warehouse"
        for customer in route:
            events.append((at(t + 0.05), "truck.departure", {"truck": truck, "location": previous}))
            t += 0.2 + rng.random() * 0.2
            events.append((at(t), "truck.arrival", {"truck": truck, "location": customer}))
            t += 0.4  # each delivery takes about half an hour
            events.append((at(t), "goods.delivery", {"truck": truck, "customer": customer}))
            previous = customer
        if truck == "T1":
            # T1 leaves A and B again in the afternoon (for customer I's profile P3).
            events.append((at(14.5), "truck.departure", {"truck": truck, "location": "A"}))
            events.append((at(15.0), "truck.departure", {"truck": truck, "location": "B"}))
        events.append((at(t + 0.05), "truck.departure", {"truck": truck, "location": previous}))
        events.append((at(t + 0.75), "truck.arrival", {"truck": truck, "location": "garage"}))
        # Location reports every 5 minutes while on the road.
        h = start
        while h < t + 0.75:
            area = rng.choice(["A", "A", "B", "C"])
            events.append((at(h), "truck.location", {"truck": truck, "area": area,
                                                     "lat": -37.78 + rng.random() / 50,
                                                     "lon": 175.28 + rng.random() / 50}))
            h += 5 / 60
    for _ in range(6):
        events.append((at(9 + rng.random() * 8), "traffic.jam", {"area": rng.choice("AAB")}))
    for customer in ["C", "C", "F", "Z"]:
        events.append((at(8 + rng.random() * 9), "order.cancelled", {"customer": customer}))
    events.sort(key=lambda e: e[0])
    out = []
    for i, (when, kind, data) in enumerate(events):
        out.append({"specversion": "1.0", "id": f"ev-{i:05d}", "source": f"urn:logistics:{kind}",
                    "type": kind, "time": when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "data": data})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    lines = [json.dumps(e) for e in day(args.seed)]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} events to {args.out}")


if __name__ == "__main__":
    main()
