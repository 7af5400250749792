"""``ListDeadLetters`` and ``RepublishDeadLetter``: the dead-letter log over the API
(docs/operations.md, "Dead letters"; the log itself: mediator/dead_letters.py).

Who sees what: a client, the letters of its own publishes (and republishes); an **operator** (a
client added with ``evamed clients add NAME --operator``) every letter — those of the brokers,
of the event log's reader and of the services too — and may filter by client. A letter that is
not the caller's is NOT_FOUND to it, exactly as one that does not exist.

Republishing goes through the door as ``Publish`` does, in the lane the letter came in (a
broker's letter under its source's lateness and size limit), as the caller: a CloudEvent letter
is published as it was or as replaced; a broker's payload (a message its mapping refused) is
mapped again by its source's rules with the topic (or stream) it came on. A replacement that is
itself a CloudEvent (an object with ``specversion``) is taken as one, whatever the letter was.
The letter is marked republished once its event is accepted; refused again, the new refusal is
a new letter.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from mediator.config import PUBLISH_LANE
from mediator.dead_letters import Letter, now_us
from mediator.door import Tally
from mediator.store.base import DeadLetterRecord
from mediator.wire import mediator_pb2

if TYPE_CHECKING:
    from mediator.service import MediatorService

FOLLOW_POLL = 0.25
"""Seconds between looks at the dead-letter log while a ListDeadLetters stream follows it."""
READ = 500
"""Letters read from the store at a time."""


def entry(record: DeadLetterRecord) -> Any:
    """A stored letter as the API sends it."""
    return mediator_pb2.DeadLetterEntry(
        position=record.position, time_us=record.time_us, reason=record.reason,
        source=record.source, client=record.client, where=record.where, id=record.event_id,
        detail=record.detail, raw=record.raw, size=record.size, kind=record.kind,
        republished_us=record.republished_us)


def is_cloudevent(raw: bytes) -> bool:
    """Whether ``raw`` reads as a CloudEvent object (it names ``specversion``)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return False
    return isinstance(value, dict) and "specversion" in value


async def is_operator(service: MediatorService, name: str) -> bool:
    record = await asyncio.to_thread(service.store.client, name)
    return record is not None and record.operator


async def list_letters(service: MediatorService, request: Any, caller: str
                       ) -> AsyncIterator[Any]:
    """The letters ``request`` asks for that ``caller`` may see, oldest first; with
    ``follow``, then each one as it is kept (until the caller goes away)."""
    from mediator.service import Refusal

    if request.after < 0 or request.last < 0:  # (found by `make fuzz`: was INTERNAL)
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "after and last are 0 or more, got "
                      f"after={request.after}, last={request.last}")
    operator = await is_operator(service, caller)
    if request.client and request.client != caller and not operator:
        raise Refusal(grpc.StatusCode.PERMISSION_DENIED, "only an operator sees another "
                      "client's dead letters (evamed clients add NAME --operator)")
    client = request.client if operator else caller
    filters = {"reason": request.reason, "source": request.source, "client": client}
    store = service.store
    after = request.after
    if request.last:
        _, head = await asyncio.to_thread(store.dead_letter_bounds)
        if not any(filters.values()):
            after = max(after, head - request.last)
        else:  # the newest N of those that match: read them all (the log is bounded)
            found: list[DeadLetterRecord] = []
            while batch := await asyncio.to_thread(store.read_dead_letters, after, READ,
                                                   **filters):
                found = [*found, *batch][-request.last:]
                after = batch[-1].position
            for record in found:
                yield entry(record)
            if not request.follow:
                return
    while True:
        batch = await asyncio.to_thread(store.read_dead_letters, after, READ, **filters)
        for record in batch:
            yield entry(record)
        if batch:
            after = batch[-1].position
            continue
        if not request.follow:
            return
        await asyncio.sleep(FOLLOW_POLL)


async def republish(service: MediatorService, request: Any, caller: str) -> Any:
    """Publish a letter again (the module docstring); the reply as Publish's."""
    from mediator.service import Refusal

    store = service.store
    found = await asyncio.to_thread(store.read_dead_letters, max(request.position - 1, 0), 1)
    letter = found[0] if found and found[0].position == request.position else None
    if letter is None or (letter.client != caller and not await is_operator(service, caller)):
        raise Refusal(grpc.StatusCode.NOT_FOUND, f"no dead letter {request.position} of yours "
                      "is kept (evamed dead-letters lists them; the log keeps the newest "
                      "dead_letters.retention)")
    raw = bytes(request.replacement) or letter.raw
    if not request.replacement and letter.size > len(letter.raw):
        raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, f"dead letter {letter.position} kept "
                      f"{len(letter.raw):,} of its {letter.size:,} bytes (dead_letters.raw_bytes):"
                      " give the whole corrected input (--file)")
    lane = letter.source if letter.source in _sources(service) else PUBLISH_LANE
    payload = letter.kind == "payload" and not is_cloudevent(raw)
    if letter.kind == "report" and not is_cloudevent(raw):
        raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, f"dead letter {letter.position} is "
                      f"service {letter.source}'s report, not an event the mediator took in: "
                      "it cannot be published again (give a corrected CloudEvent with --file "
                      "to publish one)")
    tally = Tally()
    if payload:
        line, refused = _mapped(service, letter, raw, caller)
        if refused is not None:
            await asyncio.to_thread(service.letters.record, [refused], 1)
            return mediator_pb2.PublishReply(dead_lettered=1, dead_letters=[
                mediator_pb2.DeadLetter(index=0, reason=f"{refused.reason}: {refused.detail}")])
    else:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"the input is not UTF-8 (byte "
                          f"{exc.start + 1}): a CloudEvent is JSON text") from None
    record = await asyncio.to_thread(store.client, caller)
    granted = record.granted if record is not None else ()
    async with service.door.order:
        await service._accept([" ".join(line.splitlines())], tally, lane, caller, granted)
    if tally.accepted:
        await asyncio.to_thread(store.mark_republished, letter.position, now_us())
    from mediator.service import _reply_letters

    return mediator_pb2.PublishReply(accepted=tally.accepted, dead_lettered=tally.dead,
                                     dead_letters=_reply_letters(tally))


def _sources(service: MediatorService) -> set[str]:
    return set(service.brokers.sources) if service.brokers is not None else set()


def _mapped(service: MediatorService, letter: DeadLetterRecord, payload: bytes,
            caller: str) -> tuple[str, Letter | None]:
    """A broker's payload mapped by its source's rules: the line, or the refusal."""
    from mediator.service import Refusal

    brokers = service.brokers
    if brokers is None or letter.source not in brokers.sources:
        raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, f"dead letter {letter.position} is a "
                      f"payload of source {letter.source!r}, which is not configured now: give "
                      "a corrected CloudEvent (--file) to publish it")
    mapped = brokers.remap(letter.source, letter.where, payload, letter.position)
    if isinstance(mapped, str):
        return mapped, None
    return "", Letter(mapped.reason, letter.source, mapped.detail, payload, client=caller,
                      where=letter.where, kind="payload")


__all__ = ["entry", "is_cloudevent", "list_letters", "republish"]
