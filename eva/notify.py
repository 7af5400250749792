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
    return _id(_fragments(n.profile, n.partition)[0], n.occ.ident)


def _id(prefix: str, ident: Any) -> str:
    """The digest of ``repr((profile, partition, ident))``, its first two items' part given."""
    digest = hashlib.blake2b((prefix + repr(ident) + ")").encode(), digest_size=12)
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
_Fragments = tuple[str, str, str, str]
_FRAGMENTS: dict[tuple[str, type, Any], _Fragments] = {}
_CACHED = 4096


def _fragments(profile: str, partition: Any) -> _Fragments:
    """What a composite line of ``profile`` and ``partition`` holds besides its id, time and
    constituents — the start of the id's ``repr``, the line up to the time, from the time to
    the constituents, after them — made once per profile and partition: JSON escaping and
    ``repr`` cost more than the rest of a line."""
    # Keyed by the partition's type too (True == 1, but their JSON differs); a partition that
    # is a JSON object or array (not hashable) is not cached.
    cacheable = partition is None or type(partition) is str or type(partition) is int
    key = (profile, type(partition), partition if cacheable else None)
    found = _FRAGMENTS.get(key) if cacheable else None
    if found is not None:
        return found
    name = json.dumps(profile)
    made = (f"({profile!r}, {partition!r}, ",
            '", "source": ' + _SOURCE + ', "type": "eva.composite", "subject": ' + name
            + ', "time": "',
            '", "datacontenttype": "application/json", "data": {"profile": ' + name
            + ', "constituents": ',
            ("" if partition is None else ', "partition": ' + json.dumps(partition)) + "}}")
    if cacheable:
        if len(_FRAGMENTS) >= _CACHED:
            _FRAGMENTS.clear()
        _FRAGMENTS[key] = made
    return made


def _ids_json(ids: tuple[str, ...]) -> str:
    """``json.dumps(list(ids))``: joined directly when no id needs an escape (printable ASCII
    without quotes or backslashes — what json's ASCII encoder writes as is)."""
    body = '", "'.join(ids)
    if ids and body.isascii() and body.isprintable() and "\\" not in body and (
            body.count('"') == 2 * len(ids) - 2):
        return '["' + body + '"]'
    return json.dumps(list(ids))


def composite_line(n: Notification) -> tuple[str, str]:
    """The composite's id and ``json.dumps(to_cloudevent(n))``, written directly from
    fragments made once per profile and partition: every output writes one per composite,
    and building the dict first doubled the cost. The same text, to the byte
    (tests/test_notify.py)."""
    prefix, head, middle, tail = _fragments(n.profile, n.partition)
    occ = n.occ
    ident = _id(prefix, occ.ident)
    return ident, ('{"specversion": "1.0", "id": "' + ident + head + format_time(occ.time)
                   + middle + _ids_json(occ.events) + tail)


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
