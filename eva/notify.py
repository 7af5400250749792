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
    """The digest of ``repr((profile, partition, ident))``, its first two items' part given.
    The one place a composite's id is computed (``_repr`` is ``repr``, to the character)."""
    return _blake2b((prefix + _repr(ident) + ")").encode(), digest_size=12).hexdigest()


_blake2b = hashlib.blake2b


def _repr(value: Any) -> str:
    """``repr(value)``, to the character (tests/test_notify.py). A composite's id is a digest
    of it, and ``repr`` of a nested tuple costs more than the rest of the composite's line
    (each item's ``__repr__``, the same long tag — the node's expression — escaped again for
    every composite): the identities of binary operators over primitive events are spelt
    directly (:func:`_spelt`), anything else by ``repr``."""
    spelt = _spelt(value)
    return repr(value) if spelt is None else spelt


def _spelt(value: Any) -> str | None:
    """``repr`` of a primitive's identity ``((source, id), time)`` or of a binary node's
    ``(tag, left, right)`` whose children are such, when no string in it needs an escape
    (printable ASCII without a quote or a backslash, which ``repr`` writes between single
    quotes as is); None for anything else."""
    if type(value) is not tuple:
        return None
    if len(value) == 3:
        tag = value[0]
        if type(tag) is not str:
            return None
        left = _spelt(value[1])
        if left is None:
            return None
        right = _spelt(value[2])
        if right is None:
            return None
        return f"({_text(tag)}, {left}, {right})"
    if len(value) != 2:
        return None
    pair = value[0]
    time = value[1]
    if type(pair) is not tuple or len(pair) != 2 or type(time) is not int:
        return None
    source = pair[0]
    ident = pair[1]
    if type(source) is not str or type(ident) is not str:
        return None
    body: str = source + ident
    if body.isascii() and body.isprintable() and "'" not in body and "\\" not in body:
        return f"(('{source}', '{ident}'), {time})"  # one build, where + makes one per part
    return None


_TEXTS: dict[str, str] = {}


def _text(text: str) -> str:
    """``repr`` of a node's tag, kept: a profile has few nodes, each with many composites."""
    found = _TEXTS.get(text)
    if found is None:
        if len(_TEXTS) >= _CACHED:
            _TEXTS.clear()
        found = _TEXTS[text] = repr(text)
    return found


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


_START = '{"specversion": "1.0", "id": "'


def composite_lines(notes: list[Notification], counts: dict[str, int]) -> str:
    """The lines of :func:`composite_line` for ``notes``, each ended by a newline, as one
    text, and each counted in ``counts`` by profile: the pieces of every line go into one
    list joined once (no tuple, no line object per composite), and consecutive composites
    of one profile and partition — every one, in a replay of unpartitioned profiles — share
    one look-up of their fragments."""
    parts: list[str] = []
    append = parts.append
    profile: str | None = None
    partition: Any = None
    prefix = head = middle = tail = ""
    last = -1  # composites of one step share their time: its text is made once
    stamp = ""
    run = 0  # consecutive composites of ``profile``, not yet counted
    for n in notes:
        if n.profile is not profile or n.partition is not partition:
            if profile is not None:
                counts[profile] = counts.get(profile, 0) + run
            run = 0
            profile = n.profile
            partition = n.partition
            prefix, head, middle, tail = _fragments(profile, partition)
        occ = n.occ
        if occ.time != last or not stamp:
            last = occ.time
            stamp = format_time(last)
        append(_START)
        append(_id(prefix, occ.ident))
        append(head)
        append(stamp)
        append(middle)
        append(_ids_json(occ.events))
        append(tail)
        append("\n")
        run += 1
    if profile is not None:
        counts[profile] = counts.get(profile, 0) + run
    return "".join(parts)


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
