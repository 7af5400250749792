"""Engine state as bytes: ``snapshot(engine)`` and ``restore(data)``, exact to the event.

What a state store (the Spark job keeps one engine per profile × bucket) or a restarted service
needs. The format is **data only** (docs/spark.md, "Checkpoint state"): a version line, then
zlib-compressed JSON of tagged records — scalars, tuples, lists, dicts, sets, the engine's own
classes by name with their attribute values. Reading it creates nothing but the classes of the
allow-list below, sets nothing but the attributes those classes declare, and calls no code the
data names: whoever can write a checkpoint can make an engine give wrong answers, but cannot
run code in the workers (``pickle`` would let them). An unknown version, a class or attribute
outside the list, or any malformed record is refused with :class:`SnapshotError` — whatever
goes wrong while reading (a number out of range, nesting too deep for the stack, memory) is one,
never another exception. The state is at most :data:`MAX_STATE_BYTES` of JSON, decompressed
within that bound, so a small zlib bomb cannot make the reader allocate more.

Objects are written once and referred to by number after (``["r", n]``), so shared state (a
profile in several indexes, an event in several occurrences) stays shared and cycles are kept.
The class index holds compiled predicates (closures): it is written as its predicates, in id
order, and rebuilt from them. The engine's classes may be compiled by mypyc, whose instances
take no attributes but those declared (``__mypyc_attrs__``): an object is rebuilt by calling
its constructor with placeholder arguments and then setting every attribute. The dead-letter
callback is not state: ``restore`` takes a new one.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import operator
import sys
import zlib
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from eva import ast
from eva import nodes as nd
from eva import semantics as sem
from eva.classes import ClassIndex
from eva.engine import DeadLetter, Engine, EngineConfig, _Partition, _Profile
from eva.events import Event

FORMAT = 2
"""Version of the snapshot format (1 was a pickle, no longer read). A snapshot written in
another version is refused: its records may mean something else."""
_MAGIC = b"evamed-engine-snapshot "


MAX_STATE_BYTES = 64 * 1024 * 1024
"""The most JSON text a snapshot (or a streaming log entry) may inflate to: 64 MiB. Real states
are far smaller — the Spark benchmark's largest engine, all 50,000 events of a micro-batch
buffered in one bucket (benchmarks/spark.py with --buckets 1), is 12 MB of JSON, 2 MB per
bucket at the default 16 buckets — while a 200 KB zlib bomb inflates to 200 MB. Reading stops
one byte past the bound, and :func:`snapshot` refuses to write a state over it (a snapshot that
could not be read back would lose the state at the next restart)."""


class SnapshotError(ValueError):
    """Bytes that are not an engine snapshot this version can read (or, from :func:`snapshot`,
    an engine state too large to be read back)."""


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


_X = ast.Prim("x")
_SEQ = ast.Sequence(ast.Operand(ast.ALL, _X), ast.Operand(ast.ALL, _X), None, ast.Pairs.ALL)
_NEG = ast.Negation(_X, 1, ast.Pairs.ALL)


def _occ() -> sem.Occ:
    return sem.Occ(0, (0, 0, 0), None, ())


def _leaf() -> nd.Node:
    return nd.AttributeLeaf(0)


# The mutable engine-side classes: rebuilt from constructor arguments that build a placeholder,
# every attribute then overwritten from the snapshot (so the values only need to be accepted
# by __init__).
_PLACEHOLDER: dict[type, Callable[[], tuple[Any, ...]]] = {
    nd.Budget: lambda: (1,),
    nd.AttributeLeaf: lambda: (0,),
    nd.TimeLeaf: lambda: (None,),
    nd.SelectionNode: lambda: (_leaf(), ast.Selection(_X, 1, ast.Pairs.ALL)),
    nd.NegationNode: lambda: (_leaf(), _NEG, "", 1, 0),
    nd.AnchoredNegationNode: lambda: (_leaf(), _NEG, "", False),
    nd.DList: lambda: (0, 0, 0),
    nd.BinaryNode: lambda: (_leaf(), _leaf(), _SEQ, "", False, nd.Budget(1), False),
    nd._Candidate: lambda: (_occ(), 0, 0, nd.DList(0, 0, 0), nd.DList(0, 0, 0)),
    nd.RepeatedNode: lambda: (_leaf(), _leaf(), _SEQ, "", False, nd.Budget(1)),
    sem.Occ: lambda: (0, (0, 0, 0), None, ()),
    sem.Notification: lambda: ("", None, _occ(), (0, 0, 0)),
    _Partition: lambda: (None, _leaf(), None, 0),
    _Profile: lambda: (0, ast.Profile("x", _X), 0, None, frozenset(), frozenset(), False,
                       nd.Budget(1)),
    Engine: lambda: (),
}


def _module_classes(module: Any) -> list[type]:
    return [v for v in vars(module).values()
            if isinstance(v, type) and v.__module__ == module.__name__]


# Values: rebuilt by calling the class with their fields (frozen dataclasses, named tuples,
# the engine configuration) — every dataclass of the profile language's syntax tree.
_VALUES: list[type] = [Event, DeadLetter, EngineConfig, sem.Element,
                       *(c for c in _module_classes(ast) if dataclasses.is_dataclass(c))]
_ENUMS: list[type] = [c for c in _module_classes(ast) if issubclass(c, enum.Enum)]


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


_BY_NAME: dict[str, type] = {_name(c): c for c in [*_PLACEHOLDER, *_VALUES, *_ENUMS]}


def _declared(cls: type) -> tuple[str, ...]:
    """The state attributes of an object class: what a snapshot writes and may set."""
    names = getattr(cls, "__mypyc_attrs__", None)
    if names is None:
        names = tuple(n for c in cls.__mro__ for n in getattr(c, "__slots__", ()))
        if "__dict__" in dir(cls) or not names:
            names += tuple(vars(cls(*_PLACEHOLDER[cls]())))  # interpreted, attributes in __dict__
    return tuple(dict.fromkeys(n for n in names if n != "dead_letter" and not n.startswith("__")))


def _fields(cls: type) -> tuple[str, ...]:
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)
    return tuple(cls._fields)  # type: ignore[attr-defined]  # a named tuple


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """One C-level getter for all of a class's attributes: a snapshot holds thousands of nodes
    of a handful of classes, and a per-attribute Python loop was most of its cost."""
    every = operator.attrgetter(*names)
    return every if len(names) > 1 else (lambda o: (every(o),))


# Per object class: its name in snapshots, its attribute names, the getter of their values.
_OBJECT_LAYOUTS: dict[type, tuple[str, tuple[str, ...], Callable[[Any], tuple[Any, ...]]]] = {
    cls: (_name(cls), names, _getter(names))
    for cls in _PLACEHOLDER for names in [_declared(cls)]}
_VALUE_FIELDS: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def _value_fields(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    found = _VALUE_FIELDS.get(cls)
    if found is None:
        found = _VALUE_FIELDS[cls] = _getter(_fields(cls))
    return found


_UNSET = ["u"]  # an attribute not set on this object (set lazily by the engine)
_SCALARS = frozenset((str, int, float, bool, type(None)))


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
        layout = _OBJECT_LAYOUTS.get(cls)
        if layout is not None:  # the engine's mutable objects: numbered first, they may be
            name, names, every = layout  # referred to by what they hold
            n = self.number(obj)
            if name not in self.classes:
                self.classes[name] = list(names)
            try:
                values = every(obj)
            except AttributeError:  # an attribute not set on this object: name by name
                values = tuple(getattr(obj, a, _UNSET) for a in names)
            value = self.value
            return ["o", n, name, *[v if type(v) in _SCALARS or v is _UNSET else value(v)
                                    for v in values]]
        if cls is list:
            n = self.number(obj)
            return ["l", n, *self.values(obj)]
        if cls is dict:
            n = self.number(obj)
            out: list[Any] = ["d", n]
            value = self.value
            for key, item in obj.items():
                out.append(key if type(key) in _SCALARS else value(key))
                out.append(item if type(item) in _SCALARS else value(item))
            return out
        if cls is set or cls is frozenset:
            n = self.number(obj)
            return ["s" if cls is set else "f", n, *self.values(obj)]
        if cls is deque:
            n = self.number(obj)
            return ["q", n, obj.maxlen, *self.values(obj)]
        if cls is ClassIndex:
            ids: dict[ast.Predicate, int] = obj._ids
            ordered = [pred for pred, _ in sorted(ids.items(), key=lambda kv: kv[1])]
            return ["x", self.value(ordered), obj.tests]
        if isinstance(obj, type):  # a node keeps its operator's syntax class
            if _BY_NAME.get(_name(obj)) is not obj:
                raise TypeError(f"engine state holds the class {_name(obj)}, which snapshots "
                                "do not cover")
            return ["k", _name(obj)]
        name = _name(cls)
        if _BY_NAME.get(name) is not cls:
            raise TypeError(f"engine state holds a {name}, which snapshots do not cover")
        if isinstance(obj, enum.Enum):
            return ["e", name, obj.value]
        fields = self.values(_value_fields(cls)(obj))
        return ["v", self.number(obj), name, *fields]


def snapshot(engine: Engine) -> bytes:
    """The engine's whole state: registrations, partitions, buffered events, clock, timers."""
    extra = set(getattr(engine, "__dict__", ())) - {"dead_letter", *_OBJECT_LAYOUTS[Engine][1]}
    if extra:  # set outside __init__ (interpreted engine): it would be lost
        raise TypeError(f"engine attributes {sorted(extra)} are not covered by snapshots")
    writer = _Writer()
    root = writer.value(engine)
    text = json.dumps({"classes": writer.classes, "root": root}, separators=(",", ":")).encode()
    if len(text) > MAX_STATE_BYTES:
        raise SnapshotError(f"the engine state is {len(text):,} bytes of JSON, over the "
                            f"{MAX_STATE_BYTES:,} a snapshot may hold (MAX_STATE_BYTES, "
                            "docs/spark.md): spread the keys over more buckets, or shorten the "
                            "profiles' time frames")
    return _MAGIC + str(FORMAT).encode() + b"\n" + zlib.compress(text, 1)


class _Reader:
    """Builds the engine back from records, refusing anything outside the allow-list."""

    def __init__(self, classes: Any) -> None:
        self.memo: dict[int, Any] = {}
        if not isinstance(classes, dict):
            raise SnapshotError("no class table")
        self.layouts: dict[str, tuple[type, tuple[str, ...], tuple[Any, ...]]] = {}
        for name, names in classes.items():
            cls = _BY_NAME.get(name)
            if cls is None or cls not in _PLACEHOLDER:
                raise SnapshotError(f"class {name!r} is not engine state")
            declared = set(_OBJECT_LAYOUTS[cls][1])
            if not isinstance(names, list) or not all(isinstance(n, str) and n in declared
                                                      for n in names):
                raise SnapshotError(f"attributes {names!r} are not those of {name}")
            self.layouts[name] = (cls, tuple(names), _PLACEHOLDER[cls]())
        self.tags: dict[str, Callable[[list[Any]], Any]] = {
            "t": self.r_tuple, "r": self.r_ref, "o": self.r_obj, "l": self.r_list, "d": self.r_dict,
            "s": self.r_set, "f": self.r_set, "q": self.r_deque, "x": self.r_index, "k": self.r_cls,
            "e": self.r_enum, "v": self.r_val}

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
        if layout is None or len(data) != 3 + len(layout[1]):
            raise SnapshotError(f"object {data[2:3]!r} does not match the class table")
        cls, names, placeholder = layout
        # Placeholder arguments are shared: every attribute is overwritten (or removed).
        made = cls(*placeholder)
        self.put(data[1], made)
        for attr, item in zip(names, self.values(data[3:]), strict=True):
            if item == _UNSET:
                with suppress(AttributeError, TypeError):
                    delattr(made, attr)
            else:
                setattr(made, attr, item)
        return made

    def r_list(self, data: list[Any]) -> Any:
        out: list[Any] = []
        self.put(data[1], out)
        out.extend(self.values(data[2:]))
        return out

    def r_dict(self, data: list[Any]) -> Any:
        table: dict[Any, Any] = {}
        self.put(data[1], table)
        items = self.values(data[2:])
        if len(items) % 2:
            raise SnapshotError("a dictionary with a key and no value")
        for i in range(0, len(items), 2):
            table[items[i]] = items[i + 1]
        return table

    def r_set(self, data: list[Any]) -> Any:
        members = self.values(data[2:])
        made: set[Any] | frozenset[Any] = set(members) if data[0] == "s" else frozenset(members)
        self.put(data[1], made)
        return made

    def r_deque(self, data: list[Any]) -> Any:
        bound = data[2]
        if bound is not None and (type(bound) is not int or not 0 <= bound <= sys.maxsize):
            raise SnapshotError(f"a deque bounded by {_brief(bound)}, expected none or a size "
                                f"from 0 to {sys.maxsize}")
        queue: deque[Any] = deque(maxlen=bound)
        self.put(data[1], queue)
        queue.extend(self.values(data[3:]))
        return queue

    def r_index(self, data: list[Any]) -> Any:
        index = ClassIndex()
        for pred in self.value(data[1]):
            if not isinstance(pred, (ast.Compare, ast.And, ast.Or, ast.Not, ast.ClassRef)):
                raise SnapshotError(f"class index entry {type(pred).__name__} is no predicate")
            index.add(pred, {})
        if type(data[2]) is not int or data[2] < 0:
            raise SnapshotError(f"class index test count {_brief(data[2])}, expected a count")
        index.tests = data[2]
        return index

    def r_cls(self, data: list[Any]) -> Any:
        return self.named(data[1])

    def r_enum(self, data: list[Any]) -> Any:
        cls = self.named(data[1])
        if not issubclass(cls, enum.Enum):
            raise SnapshotError(f"{data[1]} is no enumeration")
        return cls(data[2])

    def r_val(self, data: list[Any]) -> Any:
        cls = self.named(data[2])
        if cls in _PLACEHOLDER or issubclass(cls, enum.Enum):
            raise SnapshotError(f"{data[2]} is not a value class")
        made = cls(*self.values(data[3:]))
        self.put(data[1], made)
        return made

    def named(self, name: Any) -> type:
        cls = _BY_NAME.get(name) if isinstance(name, str) else None
        if cls is None:
            raise SnapshotError(f"class {name!r} is not engine state")
        return cls


def _read(text: bytes) -> Any:
    """What the records of a snapshot's (decompressed) text build."""
    document = json.loads(text)
    reader = _Reader(document.get("classes") if isinstance(document, dict) else None)
    return reader.value(document["root"])


def restore(data: bytes, dead_letter: Callable[[DeadLetter], None] | None = None) -> Engine:
    """The engine a snapshot holds; :class:`SnapshotError` if ``data`` is not a snapshot of
    this format (nothing it names is run), whatever is wrong with it."""
    head, _, body = data.partition(b"\n")
    if data[:1] == b"\x80":
        raise SnapshotError("a pickled engine (snapshot format 1, written by an older evamed): "
                            "not read, since unpickling runs whatever code the bytes name; "
                            "start on a fresh checkpoint")
    if not head.startswith(_MAGIC):
        raise SnapshotError(f"not an evamed engine snapshot (it starts with {data[:16]!r}; "
                            f"format {FORMAT} starts with {_MAGIC.decode().strip()!r})")
    version = head[len(_MAGIC):].decode(errors="replace")
    if version != str(FORMAT):
        raise SnapshotError(f"engine snapshot format {version!r}; this evamed reads format "
                            f"{FORMAT} only")
    try:
        text = inflate(body)
    except ValueError as exc:
        raise SnapshotError(f"malformed engine snapshot: {exc}") from None
    failure: str | None = None
    try:
        engine = _read(text)
    except SnapshotError:
        raise
    except Exception as exc:  # the trust boundary: see below
        # The records drive constructors and setattr on the engine's (possibly compiled)
        # classes, so a crafted value can fail anywhere, in any way: OverflowError (an integer
        # past 64 bits), RecursionError (nesting deeper than the stack), MemoryError, ... All
        # of it is bytes that are not a snapshot this version wrote. (Exception covers the
        # last two; only BaseException's exits — KeyboardInterrupt, SystemExit — go through.)
        failure = f"{type(exc).__name__}: {str(exc)[:200]}"
    if failure is not None:  # raised outside the handler: what was read is freed with it
        raise SnapshotError(f"malformed engine snapshot: {failure}")
    if type(engine) is not Engine:
        raise SnapshotError(f"the snapshot holds a {type(engine).__name__}, not an engine")
    engine.dead_letter = dead_letter or (lambda _: None)
    return engine
