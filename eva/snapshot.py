"""Engine state as bytes: ``snapshot(engine)`` and ``restore(data)``, exact to the event.

What a state store (the Spark job keeps one engine per profile × bucket) or a restarted service
needs. The format is **data only** (docs/spark.md, "Checkpoint state"): a version line, then
zlib-compressed JSON of tagged records of what :meth:`Engine.export_state` gives — the
documents (syntax-tree values), the class predicates, each profile's partitions as their state
records (:mod:`eva.state`), the clock and buffers. Nothing compiled is written: ``restore``
compiles the profiles again from their documents (:mod:`eva.compiler`) and hands the records to
the new engine. Reading creates nothing but the value classes and state records of the
allow-list below, each by calling it with the fields the class table names (which must be the
record's own, :data:`eva.state.FIELDS`), and calls no code the data names: whoever can write a
checkpoint can make an engine give wrong answers, but cannot run code in the workers
(``pickle`` would let them). Another version, a class or field outside the list, or any
malformed record is refused with :class:`SnapshotError` naming what was found and expected —
whatever goes wrong while reading (a number out of range, nesting too deep for the stack,
memory) is one, never another exception. The state is at most :data:`MAX_STATE_BYTES` of JSON,
decompressed within that bound, so a small zlib bomb cannot make the reader allocate more.

Objects are written once and referred to by number after (``["r", n]``), so shared state (a
profile's budget in all its partitions, a duplicate list in the expiry queue, an event in the
buffer and the admitted list) stays shared. The dead-letter callback is not state: ``restore``
takes a new one.

The records a partition holds by the thousand have flat layouts of their own (``_FLAT``): an
occurrence is ``["O", n, time, key, ident, events, anchor]`` with its tuples as plain JSON
arrays, a duplicate list ``["D", n, number, role, first_pos, count, [index, pos, occ, ...]]``,
a binary node's state ``["B", *fields]`` with its expiry queue flat — a third of the generic
records' size, and read by calling the constructor once.

**By partition** (a state store that writes only what changed: the Spark job,
``spark_jobs/state.py``). :func:`snapshot_core` writes everything but the partitions' state:
``evamed-engine-core <FORMAT>``, a newline, zlib'd ``{"classes": <every record class>, "root":
<export_state(records=False)>}`` — each profile's partitions listed by key only, none read to
write it. :func:`take_changed` gives the partitions changed since its last call by
:func:`partition_id` (``[profile index, partition key]`` as compact JSON), each record
``evamed-partition <FORMAT>``, a newline and the JSON of ``[value, state, created, number]``
(uncompressed: records are small and stores compress), written without a class table (the
core's is used) and with the profile's budget as object 0 (``["r", 0]``: the core holds it, all
partitions share it); None for one gone. :func:`restore_core` builds the engine of a core and
hands it a loader: a record is read the first time the engine needs its partition (see
``Engine._load``), checked as a snapshot's records are (allow-list, bound, shape, the
partition it names, the profile it fits) — a refusal is a :class:`SnapshotError` from the call
that needed it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import json
import operator
import sys
import zlib
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

import orjson

from eva import ast
from eva import semantics as sem
from eva import state as records
from eva.engine import Engine, Fed
from eva.events import DeadLetter, Event
from eva.semantics import partition_key
from eva.state import SnapshotError as SnapshotError  # raised by Engine.import_state too

FORMAT = 5
"""Version of the snapshot format: 1 was a pickle, 2 the engine's objects with their compiled
settings (no longer read); 3 held state records only; 4 adds each profile's partition numbering
(``next_order``, ``opened``: the order state_cap evicts in); 5 names a timer's partition by its
number before its key (keys of different kinds do not compare), and adds cores and partition
records (:func:`snapshot_core`). A snapshot written in another version is refused: its records
may mean something else."""
_MAGIC = b"evamed-engine-snapshot "
_CORE_MAGIC = b"evamed-engine-core "
_PARTITION_HEAD = b"evamed-partition " + str(FORMAT).encode() + b"\n"
_T = TypeVar("_T")


MAX_STATE_BYTES = 64 * 1024 * 1024
"""The most JSON text a snapshot (or a streaming log entry) may inflate to: 64 MiB. Real states
are far smaller — the Spark benchmark's largest engine, all 50,000 events of a micro-batch
buffered in one bucket (benchmarks/spark.py with --buckets 1), is 12 MB of JSON, 2 MB per
bucket at the default 16 buckets — while a 200 KB zlib bomb inflates to 200 MB. Reading stops
one byte past the bound, and :func:`snapshot` refuses to write a state over it (a snapshot that
could not be read back would lose the state at the next restart)."""


def inflate(body: bytes) -> bytes:
    """zlib-compressed ``body`` decompressed, at most :data:`MAX_STATE_BYTES`: the output stops
    one byte past the bound, however far the input would inflate. ValueError naming what is
    wrong — over the bound, truncated, trailing bytes, not zlib."""
    bound = MAX_STATE_BYTES
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(body, bound + 1)
    except zlib.error as exc:
        raise ValueError(f"not zlib data ({exc})") from None
    if len(text) > bound:
        raise ValueError(f"it inflates to more than {bound:,} bytes, the most checkpoint state "
                         "may hold (MAX_STATE_BYTES)")
    if not inflater.eof:
        raise ValueError("the compressed data is truncated")
    if inflater.unused_data:
        raise ValueError(f"{len(inflater.unused_data):,} bytes follow the compressed data")
    return text


def _brief(value: Any) -> str:
    """A value from the data in a message: its repr, cut (an integer may have 4,300 digits)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "…"


def _module_classes(module: Any) -> list[type]:
    return [v for v in vars(module).values()
            if isinstance(v, type) and v.__module__ == module.__name__]


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# State records: rebuilt by calling the class with their fields, in the order of the class
# table (which must be the class's own). Occurrences are records too (shared, not values).
_RECORDS: dict[type, tuple[str, ...]] = {
    **records.FIELDS, sem.Occ: ("time", "key", "ident", "events", "anchor")}
# Values: rebuilt by calling the class with their fields (frozen dataclasses, named tuples) —
# every dataclass of the profile language's syntax tree.
_VALUES: list[type] = [Event, sem.Element, Fed,
                       *(c for c in _module_classes(ast) if dataclasses.is_dataclass(c))]
_ENUMS: list[type] = [c for c in _module_classes(ast) if issubclass(c, enum.Enum)]
_BY_NAME: dict[str, type] = {_name(c): c for c in [*_RECORDS, *_VALUES, *_ENUMS]}


def _fields(cls: type) -> tuple[str, ...]:
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)
    return tuple(cls._fields)  # type: ignore[attr-defined]  # a named tuple


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """One C-level getter for all of a class's fields: a snapshot holds thousands of records
    of a handful of classes, and a per-field Python loop was most of its cost."""
    every = operator.attrgetter(*names)
    return every if len(names) > 1 else (lambda o: (every(o),))


# Per record class: its name in snapshots, its field names, the getter of their values.
_RECORD_LAYOUTS: dict[type, tuple[str, tuple[str, ...], Callable[[Any], tuple[Any, ...]]]] = {
    cls: (_name(cls), names, _getter(names)) for cls, names in _RECORDS.items()}
_VALUE_FIELDS: dict[type, Callable[[Any], tuple[Any, ...]]] = {}
_CLASS_TABLE: dict[str, list[str]] = {name: list(names) for name, names, _ in
                                      _RECORD_LAYOUTS.values()}
"""Every record class with its fields: a core's class table, which its partitions' records
(written without one) are read with."""


def _value_fields(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    found = _VALUE_FIELDS.get(cls)
    if found is None:
        found = _VALUE_FIELDS[cls] = _getter(_fields(cls))
    return found


_SCALARS = frozenset((str, int, float, bool, type(None)))
_DIGITS = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_NUMBER = b"0" * 19
"""19 digits in a row (once every digit reads 0): a number orjson may not read back as written —
an integer past 64 bits, which it reads as a float."""


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while a snapshot is written or read: it would pass
    once every 700 new objects over all of them, tens of thousands, every one still reachable —
    two thirds of the time of both (measured, benchmarks/engine.py ``--only per``)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _frozen(data: Any) -> Any:
    """A JSON array as the tuple it was written from (arrays in it too), other data as is."""
    if type(data) is not list:
        if type(data) is dict:
            raise SnapshotError("an object where a tuple was expected")
        return data
    out = tuple(data)
    try:
        hash(out)  # of scalars only (the common case): nothing nested to convert
    except TypeError:
        out = tuple([_frozen(v) for v in data])
    return out


def _flat(data: Any, width: int, what: str) -> list[Any]:
    """A flat list of ``width``-tuples (an ``_FLAT`` record's field)."""
    if type(data) is not list or len(data) % width:
        raise SnapshotError(f"{what}: {_brief(data)}, expected a list of {width}-tuples")
    return data


class _Writer:
    """Turns the engine's object graph into JSON-ready records (one pass, objects numbered)."""

    def __init__(self) -> None:
        self.memo: dict[int, int] = {}
        self.keep: list[Any] = []  # objects numbered: alive until the end, so ids stay unique
        self.classes: dict[str, list[str]] = {}

    def number(self, obj: Any) -> int:
        n = self.memo[id(obj)] = len(self.keep)
        self.keep.append(obj)
        return n

    def values(self, items: Any) -> list[Any]:
        value = self.value
        return [v if type(v) in _SCALARS else value(v) for v in items]

    def value(self, obj: Any) -> Any:
        cls: type = type(obj)
        if cls in _SCALARS:
            return obj
        seen = self.memo.get(id(obj))
        if seen is not None:
            return ["r", seen]
        if cls is tuple:
            return ["t", *self.values(obj)]
        flat = _FLAT_WRITERS.get(cls)
        if flat is not None:
            return flat(self, obj)
        layout = _RECORD_LAYOUTS.get(cls)
        if layout is not None:  # a state record (shared: numbered)
            name, names, every = layout
            n = self.number(obj)
            if name not in self.classes:
                self.classes[name] = list(names)
            return ["o", n, name, *self.values(every(obj))]
        # Containers are never shared in the exported state: written in place, unnumbered.
        if cls is list:
            return ["l", *self.values(obj)]
        if cls is dict:
            out: list[Any] = ["d"]
            value = self.value
            for key, item in obj.items():
                out.append(key if type(key) in _SCALARS else value(key))
                out.append(item if type(item) in _SCALARS else value(item))
            return out
        if cls is set or cls is frozenset:
            return ["s" if cls is set else "f", *self.values(obj)]
        if cls is deque:
            return ["q", obj.maxlen, *self.values(obj)]
        name = _name(cls)
        if _BY_NAME.get(name) is not cls:
            raise TypeError(f"engine state holds a {name}, which snapshots do not cover")
        if isinstance(obj, enum.Enum):
            return ["e", name, obj.value]
        fields = self.values(_value_fields(cls)(obj))
        return ["v", self.number(obj), name, *fields]


    def occ(self, occ: sem.Occ) -> list[Any]:
        # Its fields are times and tuples of scalars and tuples: JSON arrays as they are.
        return ["O", self.number(occ), occ.time, occ.key, occ.ident, occ.events, occ.anchor]

    def dlist(self, dl: records.DList) -> list[Any]:
        value = self.value
        kept: list[Any] = []
        for index, (pos, occ) in dl.kept.items():
            kept += (index, pos, value(occ))
        return ["D", self.number(dl), dl.number, dl.role, dl.first_pos, dl.count, kept]

    def binary(self, st: records.BinaryState) -> list[Any]:
        value = self.value
        # In field order, as the reader numbers them: the lists before the expiry queue that
        # refers to them.
        head = ["B", value(st.left), value(st.right), value(st.budget),
                [value(dl) for dl in st.lists], st.position]
        expiry: list[Any] = []
        for time, dl, index in st.expiry:
            expiry += (time, value(dl), index)
        return [*head, expiry, st.now, value(st.pending), value(st.closing)]


_FLAT_WRITERS: dict[type, Callable[[_Writer, Any], list[Any]]] = {
    sem.Occ: _Writer.occ, records.DList: _Writer.dlist, records.BinaryState: _Writer.binary}
"""The records with flat layouts (see the module's notes), by class."""


def _framed(magic: bytes, text: bytes) -> bytes:
    return magic + str(FORMAT).encode() + b"\n" + zlib.compress(text, 1)


def _bounded(document: Any, what: str) -> bytes:
    """``document`` as JSON text, refused when over :data:`MAX_STATE_BYTES` (``what``: what
    it is, for the message)."""
    text = json.dumps(document, separators=(",", ":")).encode()
    if len(text) > MAX_STATE_BYTES:
        raise SnapshotError(f"{what} is {len(text):,} bytes of JSON, over the "
                            f"{MAX_STATE_BYTES:,} a snapshot may hold (MAX_STATE_BYTES, "
                            "docs/spark.md): spread the keys over more buckets, or shorten the "
                            "profiles' time frames")
    return text


def snapshot(engine: Engine) -> bytes:
    """The engine's whole state: registrations, partitions, buffered events, clock, timers."""
    writer = _Writer()
    with _collector_paused():
        root = writer.value(engine.export_state())
        text = _bounded({"classes": writer.classes, "root": root}, "the engine state")
    return _framed(_MAGIC, text)


def partition_id(index: int, key: Any) -> str:
    """The id of a partition's record: its profile's index and its partition key
    (:func:`eva.semantics.partition_key`; None without ``per``) as compact JSON, e.g.
    ``[0,["str","parcel-7"]]`` — the same in every process and after every restore."""
    try:
        return json.dumps([index, key], separators=(",", ":"))
    except (TypeError, ValueError):
        raise SnapshotError(f"partition key {_brief(key)} of profile {index} has no JSON "
                            "spelling (a fed partition value snapshots do not cover)") from None


def snapshot_core(engine: Engine) -> bytes:
    """Everything but the partitions' state records: configuration, documents, predicates,
    each profile's metadata (budget, partition numbering) and the keys of its partitions,
    clock, buffers, timers. Read back by :func:`restore_core` with the records
    :func:`take_changed` gave up to now; no partition is read to write it."""
    writer = _Writer()
    with _collector_paused():
        root = writer.value(engine.export_state(records=False))
        text = _bounded({"classes": _CLASS_TABLE, "root": root}, "the engine's core")
    return _framed(_CORE_MAGIC, text)


def take_changed(engine: Engine) -> dict[str, bytes | None]:
    """The partitions changed since the last call (created, stepped, collected by a sweep or
    the clock, evicted by the state cap; None: dropped, or its profile removed), by
    :func:`partition_id`: their records. The first call on an engine not restored from a
    core gives every partition it holds (the store that takes them starts empty); after
    :func:`restore_core`, only what changed since. If a record cannot be written (over
    :data:`MAX_STATE_BYTES`) nothing is taken: the next call reports it all again."""
    out: dict[str, bytes | None] = {}
    with _collector_paused():
        for index, key, budget, record in engine.changed_partitions():
            ident = partition_id(index, key)
            out[ident] = None if record is None else _record_bytes(ident, budget, record)
    engine.forget_changes()
    return out


def _record_bytes(ident: str, budget: records.Budget | None, record: list[Any]) -> bytes:
    """A partition's record (``Engine.changed_partitions``) as bytes."""
    writer = _Writer()
    writer.number(budget)  # number 0: the profile's budget, which the core holds
    return _PARTITION_HEAD + _bounded(writer.value(record), f"partition {ident}")


class _Reader:
    """Builds the engine back from records, refusing anything outside the allow-list."""

    def __init__(self, classes: Any) -> None:
        self.memo: dict[int, Any] = {}
        if not isinstance(classes, dict):
            raise SnapshotError("no class table")
        self.layouts: dict[str, tuple[type, int]] = {}
        for name, names in classes.items():
            cls = _BY_NAME.get(name)
            if cls is None or cls not in _RECORDS:
                raise SnapshotError(f"class {name!r} is not engine state")
            if names != list(_RECORDS[cls]):
                raise SnapshotError(f"fields {_brief(names)} are not those of {name}, "
                                    f"{list(_RECORDS[cls])}")
            self.layouts[name] = (cls, len(names))
        self.tags: dict[str, Callable[[list[Any]], Any]] = {
            "t": self.r_tuple, "r": self.r_ref, "o": self.r_obj, "l": self.r_list, "d": self.r_dict,
            "s": self.r_set, "f": self.r_set, "q": self.r_deque, "e": self.r_enum, "v": self.r_val,
            "O": self.r_occ, "D": self.r_dlist, "B": self.r_binary}

    def put(self, n: Any, obj: Any) -> None:
        if type(n) is not int or n in self.memo:
            raise SnapshotError(f"object number {n!r} is not new")
        self.memo[n] = obj

    def values(self, items: list[Any]) -> list[Any]:
        value = self.value
        return [v if type(v) is not list else value(v) for v in items]

    def value(self, data: Any) -> Any:
        if type(data) is not list:
            if type(data) is dict:
                raise SnapshotError("a bare object where a value was expected")
            return data
        make = self.tags.get(data[0]) if data and type(data[0]) is str else None
        if make is None:
            raise SnapshotError(f"unknown record {data[:1]!r}")
        return make(data)

    def r_tuple(self, data: list[Any]) -> Any:
        return tuple(self.values(data[1:]))

    def r_ref(self, data: list[Any]) -> Any:
        if len(data) != 2 or type(data[1]) is not int or data[1] not in self.memo:
            raise SnapshotError(f"reference {data[1:]!r} to nothing written before")
        return self.memo[data[1]]

    def r_obj(self, data: list[Any]) -> Any:
        layout = self.layouts.get(data[2]) if len(data) > 2 and type(data[2]) is str else None
        if layout is None or len(data) != 3 + layout[1]:
            raise SnapshotError(f"record {data[2:3]!r} does not match the class table")
        made = layout[0](*self.values(data[3:]))
        self.put(data[1], made)
        return made

    def r_occ(self, data: list[Any]) -> Any:
        if len(data) != 7:
            raise SnapshotError(f"an occurrence of {len(data) - 2} fields, expected 5")
        anchor = data[6]
        made = sem.Occ(data[2], _frozen(data[3]), _frozen(data[4]), _frozen(data[5]),
                       None if anchor is None else _frozen(anchor))
        self.put(data[1], made)
        return made

    def r_dlist(self, data: list[Any]) -> Any:
        if len(data) != 7:
            raise SnapshotError(f"a duplicate list of {len(data) - 2} fields, expected 5")
        flat = _flat(data[6], 3, "kept elements")
        value = self.value
        kept = {flat[i]: (flat[i + 1], value(flat[i + 2])) for i in range(0, len(flat), 3)}
        made = records.DList(data[2], data[3], data[4], data[5], kept)
        self.put(data[1], made)
        return made

    def r_binary(self, data: list[Any]) -> Any:
        if len(data) != 10:
            raise SnapshotError(f"a binary node's state of {len(data) - 1} fields, expected 9")
        value = self.value
        left, right, budget = value(data[1]), value(data[2]), value(data[3])
        lists = deque([value(dl) for dl in _flat(data[4], 1, "duplicate lists")])
        flat = _flat(data[6], 3, "expiry queue")
        expiry = deque([(flat[i], value(flat[i + 1]), flat[i + 2])
                        for i in range(0, len(flat), 3)])
        return records.BinaryState(left, right, budget, lists, data[5], expiry, data[7],
                                   value(data[8]), value(data[9]))

    def r_list(self, data: list[Any]) -> Any:
        return self.values(data[1:])

    def r_dict(self, data: list[Any]) -> Any:
        items = self.values(data[1:])
        if len(items) % 2:
            raise SnapshotError("a dictionary with a key and no value")
        return dict(zip(items[::2], items[1::2], strict=True))

    def r_set(self, data: list[Any]) -> Any:
        members = self.values(data[1:])
        return set(members) if data[0] == "s" else frozenset(members)

    def r_deque(self, data: list[Any]) -> Any:
        bound = data[1] if len(data) > 1 else None
        if bound is not None and (type(bound) is not int or not 0 <= bound <= sys.maxsize):
            raise SnapshotError(f"a deque bounded by {_brief(bound)}, expected none or a size "
                                f"from 0 to {sys.maxsize}")
        return deque(self.values(data[2:]), maxlen=bound)

    def r_enum(self, data: list[Any]) -> Any:
        cls = self.named(data[1])
        if not issubclass(cls, enum.Enum):
            raise SnapshotError(f"{data[1]} is no enumeration")
        return cls(data[2])

    def r_val(self, data: list[Any]) -> Any:
        cls = self.named(data[2])
        if cls in _RECORDS or issubclass(cls, enum.Enum):
            raise SnapshotError(f"{data[2]} is not a value class")
        made = cls(*self.values(data[3:]))
        self.put(data[1], made)
        return made

    def named(self, name: Any) -> type:
        cls = _BY_NAME.get(name) if isinstance(name, str) else None
        if cls is None:
            raise SnapshotError(f"class {name!r} is not engine state")
        return cls


def _parse(text: bytes) -> Any:
    """The JSON document of a snapshot's (decompressed) text or of a partition record."""
    # orjson reads several times faster; json reads what it would read wrongly (an integer
    # past 64 bits) or not at all (NaN, a lone surrogate, nesting past its limit).
    if text.translate(_DIGITS).find(_LONG_NUMBER) < 0:
        with contextlib.suppress(orjson.JSONDecodeError):
            return orjson.loads(text)
    return json.loads(text)


def _state(text: bytes) -> tuple[dict[str, Any], _Reader]:
    """The engine state the records of a snapshot's or core's text build, and their reader
    (its class table checked)."""
    document = _parse(text)
    reader = _Reader(document.get("classes") if isinstance(document, dict) else None)
    with _collector_paused():
        state = reader.value(document["root"])
    if type(state) is not dict:
        raise SnapshotError(f"the snapshot holds a {type(state).__name__}, not an engine's "
                            "state")
    return state, reader


def _unframed(data: bytes, magic: bytes, what: str) -> bytes:
    """The JSON text of a snapshot or core (``magic``: its first line's start): its version
    checked, decompressed within the bound."""
    head, _, body = data.partition(b"\n")
    if not head.startswith(magic):
        raise SnapshotError(f"not an evamed {what} (it starts with {data[:16]!r}; "
                            f"format {FORMAT} starts with {magic.decode().strip()!r})")
    version = head[len(magic):].decode(errors="replace")
    if version != str(FORMAT):
        raise SnapshotError(f"{what} format {version!r}; this evamed reads format {FORMAT} only")
    try:
        return inflate(body)
    except ValueError as exc:
        raise SnapshotError(f"malformed {what}: {exc}") from None


def _guarded(what: str, build: Callable[[], _T]) -> _T:
    """``build()``, whatever goes wrong in it a :class:`SnapshotError` naming ``what``."""
    failure: str | None = None
    try:
        return build()
    except SnapshotError:
        raise
    except Exception as exc:  # the trust boundary: see below
        # The records drive constructors and setattr on the engine's (possibly compiled)
        # classes, so a crafted value can fail anywhere, in any way: OverflowError (an integer
        # past 64 bits), RecursionError (nesting deeper than the stack), MemoryError, ... All
        # of it is bytes that are not a snapshot this version wrote. (Exception covers the
        # last two; only BaseException's exits — KeyboardInterrupt, SystemExit — go through.)
        failure = f"{type(exc).__name__}: {str(exc)[:200]}"
    # Raised outside the handler: what was read is freed with it.
    raise SnapshotError(f"malformed {what}: {failure}")


def restore(data: bytes, dead_letter: Callable[[DeadLetter], None] | None = None) -> Engine:
    """The engine a snapshot holds; :class:`SnapshotError` if ``data`` is not a snapshot of
    this format (nothing it names is run), whatever is wrong with it."""
    if data[:1] == b"\x80":
        raise SnapshotError("a pickled engine (snapshot format 1, written by an older evamed): "
                            "not read, since unpickling runs whatever code the bytes name; "
                            "start on a fresh checkpoint")
    text = _unframed(data, _MAGIC, "engine snapshot")

    def build() -> Engine:
        state, _ = _state(text)
        return Engine.import_state(state, dead_letter)

    return _guarded("engine snapshot", build)


def restore_core(core: bytes, load: Callable[[str], bytes | None],
                 dead_letter: Callable[[DeadLetter], None] | None = None) -> Engine:
    """The engine of a core (:func:`snapshot_core`) and its partitions' records: a record is
    read through ``load(partition_id)`` the first time the engine needs the partition — an
    event or timer of its key, a sweep, a tick of a time class its profile uses, the state
    cap's eviction, ``at_rest``, ``export_state`` (``snapshot``) — and a profile without
    ``per``'s one partition at once. The same engine, to every answer, as ``restore`` of a
    snapshot taken where the core was. :class:`SnapshotError` if the core or a record is not
    of this format or malformed, or ``load`` has no record of a partition the core lists —
    from this call, or from the call that first needs that partition (the engine is then
    unusable: its state store does not hold one state)."""
    text = _unframed(core, _CORE_MAGIC, "engine core")

    def build() -> Engine:
        state, reader = _state(text)

        def loader(index: int, key: Hashable, budget: records.Budget) -> list[Any]:
            ident = partition_id(index, key)
            data = load(ident)
            if data is None:
                raise SnapshotError(f"partition {ident}: the engine core lists it, but load "
                                    "gave no record (the records and the core are not of one "
                                    "state: write every record take_changed gives)")
            return _guarded(f"partition record {ident}",
                            lambda: _partition_record(reader, data, key, budget, ident))

        return Engine.import_state(state, dead_letter, loader)

    return _guarded("engine core", build)


def _partition_record(reader: _Reader, data: bytes, key: Hashable, budget: records.Budget,
                      ident: str) -> list[Any]:
    """A partition's record read back: [value, state, created, order] of the partition of
    ``key``, its references to object 0 to the profile's ``budget``."""
    if not data.startswith(_PARTITION_HEAD):
        raise SnapshotError(f"partition {ident}: not an evamed partition record of format "
                            f"{FORMAT} (it starts with {data[:20]!r})")
    text = data[len(_PARTITION_HEAD):]
    if len(text) > MAX_STATE_BYTES:
        raise SnapshotError(f"partition {ident}: its record is {len(text):,} bytes, over the "
                            f"{MAX_STATE_BYTES:,} a record may hold (MAX_STATE_BYTES)")
    reader.memo = {0: budget}
    record = reader.value(_parse(text))
    if type(record) is not list or len(record) != 4:
        raise SnapshotError(f"partition {ident}: its record holds {_brief(record)}, expected "
                            "[value, state, created, number]")
    if key is not None and partition_key(record[0]) != key:
        raise SnapshotError(f"partition {ident}: its record is of partition "
                            f"{_brief(record[0])}")
    return record


def to_data(value: Any) -> dict[str, Any]:
    """Any value made of engine state — containers, tuples, sets, events, occurrences, state
    records, syntax-tree values — as JSON-ready data with its class table: what a checkpoint
    of something above the engine (the plan runner: transforms/runner.py) holds. Read back
    with :func:`from_data`, as a snapshot is: the allow-list, nothing run."""
    writer = _Writer()
    with _collector_paused():
        root = writer.value(value)
    return {"classes": writer.classes, "root": root}


def from_data(data: Any, what: str = "state") -> Any:
    """The value :func:`to_data` wrote; :class:`SnapshotError` naming ``what`` if it is not
    such data."""
    if type(data) is not dict or "root" not in data:
        raise SnapshotError(f"{what}: {_brief(data)}, expected a class table and a root")

    def build() -> Any:
        return _Reader(data.get("classes")).value(data["root"])

    return _guarded(what, build)
