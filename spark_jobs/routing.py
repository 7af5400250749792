"""What the batch and the streaming job share: which events a profile can see, which bucket of
its partitions an event goes to, documents parsed once per worker."""

from __future__ import annotations

import json
import zlib
from collections.abc import Hashable, Iterable
from functools import lru_cache
from typing import Any, TypeVar

from eva import ast
from eva.classes import Matcher, compile_predicate
from eva.events import Event, field_path
from eva.parser import parse
from eva.semantics import partition_key


@lru_cache(maxsize=16)
def document(text: str) -> ast.Document:
    return parse(text)


def event_matchers(profile: ast.Profile, doc: ast.Document) -> list[Matcher]:
    """The predicates of the profile's event classes: an event matching none is not its event."""
    classes = doc.class_map()
    used = sorted({n.name for n in ast.walk(profile.expr) if isinstance(n, ast.Prim)})
    return [compile_predicate(body, classes) for name in used
            if not isinstance(body := classes[name].body, ast.Every)]


def envelope_only(profile: ast.Profile, doc: ast.Document) -> bool:
    """Whether the profile's event classes test only ``type`` and ``source``: then whether an
    event is the profile's follows from those two alone, and the fan-out decides it once per
    (type, source) pair (profiles.Router)."""
    classes = doc.class_map()
    used = {n.name for n in ast.walk(profile.expr) if isinstance(n, ast.Prim)}
    return all(_paths(body, classes) <= {"type", "source"} for name in used
               if not isinstance(body := classes[name].body, ast.Every))


def clock_driven(profile: ast.Profile, doc: ast.Document) -> bool:
    """Whether the profile's engine acts without events (its compiled spec is ``timed``, or it
    uses a time class): a negation, a time class, evaluation at the end of intervals."""
    classes = doc.class_map()
    return profile.evaluation is ast.Evaluation.END_OF_INTERVAL or any(
        isinstance(n, ast.Negation) or (isinstance(n, ast.Prim)
                                        and isinstance(classes[n.name].body, ast.Every))
        for n in ast.walk(profile.expr))


def _paths(pred: ast.Predicate, classes: dict[str, ast.ClassDef]) -> set[str]:
    if isinstance(pred, ast.Compare):
        return {pred.path}
    if isinstance(pred, ast.ClassRef):
        body = classes[pred.name].body
        return set() if isinstance(body, ast.Every) else _paths(body, classes)
    if isinstance(pred, ast.Not):
        return _paths(pred.operand, classes)
    return _paths(pred.left, classes) | _paths(pred.right, classes)


def bucket(event: Event, per: str | None, buckets: int) -> int | None:
    """The bucket of the event's partition (0 without ``per``); None if the event has no value
    for ``per`` (the profile does not see it). A stable hash, the same in every process."""
    return 0 if per is None else bucket_at(event, field_path(per), buckets)


def bucket_at(event: Event, per: tuple[str, tuple[str, ...]], buckets: int) -> int | None:
    """``bucket`` of a ``per`` path split by ``field_path`` (once per table, not per event)."""
    value: Any = event.field_at(*per)
    if value is None:
        return None
    return _bucket_of(partition_key(value), buckets)


@lru_cache(maxsize=65_536)
def _bucket_of(key: Hashable, buckets: int) -> int:
    # Partition values repeat (a truck, a customer): the JSON text and its checksum are worth
    # keeping; this was most of the routing cost per event.
    return zlib.crc32(json.dumps(key).encode()) % buckets


K = TypeVar("K")


def memberships(routes: Iterable[tuple[K, str | None, list[Matcher]]], event: Event,
                buckets: int) -> list[tuple[K, int]]:
    """The (profile, bucket) pairs an event belongs to, given each profile's (key, ``per``
    path, matchers): profiles one of whose classes it matches, in the bucket of its ``per``
    value (0 without ``per``)."""
    out = []
    for key, per, matchers in routes:
        if any(match(event) for match in matchers):
            group = bucket(event, per, buckets)
            if group is not None:
                out.append((key, group))
    return out
