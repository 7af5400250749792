"""Composite events as CloudEvents (DESIGN §5)."""

from __future__ import annotations

import hashlib
from typing import Any

from mediator.eva.events import format_time
from mediator.eva.reference import Notification

SOURCE = "urn:evamed"


def composite_id(n: Notification) -> str:
    """Deterministic: the same composite of the same profile always gets the same id, so a
    restarted pipeline can write idempotently."""
    digest = hashlib.blake2b(repr((n.profile, n.partition, n.occ.ident)).encode(), digest_size=12)
    return digest.hexdigest()


def to_cloudevent(n: Notification) -> dict[str, Any]:
    data: dict[str, Any] = {"profile": n.profile, "constituents": list(n.occ.events)}
    if n.partition is not None:
        data["partition"] = n.partition
    return {
        "specversion": "1.0",
        "id": composite_id(n),
        "source": SOURCE,
        "type": "eva.composite",
        "subject": n.profile,
        "time": format_time(n.occ.time),
        "datacontenttype": "application/json",
        "data": data,
    }
