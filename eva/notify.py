"""Composite events as CloudEvents (DESIGN §5)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from eva.events import DeadLetter, format_time
from eva.events import to_cloudevent as event_to_cloudevent
from eva.semantics import Notification

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


_SOURCE = json.dumps(SOURCE)


def composite_line(n: Notification) -> tuple[str, str]:
    """The composite's id and ``json.dumps(to_cloudevent(n))``, written directly: every output
    writes one per composite, and building the dict first doubled the cost. The same text, to the
    byte (tests/test_notify.py)."""
    ident = composite_id(n)
    profile = json.dumps(n.profile)
    partition = "" if n.partition is None else ', "partition": ' + json.dumps(n.partition)
    return ident, ('{"specversion": "1.0", "id": "' + ident + '", "source": ' + _SOURCE
                   + ', "type": "eva.composite", "subject": ' + profile + ', "time": "'
                   + format_time(n.occ.time) + '", "datacontenttype": "application/json", '
                   '"data": {"profile": ' + profile + ', "constituents": '
                   + json.dumps(list(n.occ.events)) + partition + "}}")


def dead_letter_record(letter: DeadLetter) -> dict[str, Any]:
    """A dead letter as the JSON record every output writes: reason, detail, the event or the
    raw input."""
    record: dict[str, Any] = {"reason": letter.reason, "detail": letter.detail}
    if letter.event is not None:
        record["event"] = event_to_cloudevent(letter.event)
    if letter.raw is not None:
        record["raw"] = letter.raw
    return record


def tuples_to_json(value: Any) -> Any:
    """Identities and order keys are nested tuples; JSON carries them as nested lists."""
    return [tuples_to_json(v) for v in value] if isinstance(value, tuple) else value


def tuples_from_json(value: Any) -> Any:
    return tuple(tuples_from_json(v) for v in value) if isinstance(value, list) else value
