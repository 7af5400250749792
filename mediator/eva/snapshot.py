"""Engine state as bytes: ``snapshot(engine)`` and ``restore(data)``, exact to the event.

What a state store (the Spark job keeps one engine per profile × bucket) or a restarted service
needs. Plain ``pickle`` cannot do it: the engine's classes are compiled by mypyc, whose
instances unpickle only through an ``__init__`` callable without arguments, and the class index
holds compiled predicates (closures). So this module pickles with a reducer of its own: every
engine-side object is rebuilt by calling its constructor with placeholder arguments and then
setting every attribute (``__mypyc_attrs__`` when compiled, ``__slots__``/``__dict__`` when
interpreted); the class index is rebuilt from its predicates, in id order, so ids stay the
same. The dead-letter callback is not state: ``restore`` takes a new one.
"""

from __future__ import annotations

import io
import operator
import pickle
from collections.abc import Callable
from typing import Any

from mediator.eva import ast
from mediator.eva import nodes as nd
from mediator.eva import semantics as sem
from mediator.eva.classes import ClassIndex
from mediator.eva.engine import DeadLetter, Engine, EngineConfig, _Partition, _Profile
from mediator.eva.events import Event

_X = ast.Prim("x")
_SEQ = ast.Sequence(ast.Operand(ast.ALL, _X), ast.Operand(ast.ALL, _X), None, ast.Pairs.ALL)
_NEG = ast.Negation(_X, 1, ast.Pairs.ALL)


def _occ() -> sem.Occ:
    return sem.Occ(0, (0, 0, 0), None, ())


def _leaf() -> nd.Node:
    return nd.AttributeLeaf(0)


# Constructor arguments that build a placeholder of each class; every attribute is then
# overwritten from the snapshot, so the values only need to be accepted by __init__.
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
_FROZEN = (Event, DeadLetter, EngineConfig)  # frozen or plain dataclasses: rebuilt from fields


def _attributes(obj: Any) -> tuple[str, ...]:
    cls = type(obj)
    names = getattr(cls, "__mypyc_attrs__", None)
    if names is None:
        names = tuple(n for c in cls.__mro__ for n in getattr(c, "__slots__", ()))
        names += tuple(getattr(obj, "__dict__", {}))
    return tuple(n for n in names if n != "dead_letter" and not n.startswith("__"))


# Per class whose attributes the class fixes (compiled, or slots only): their names and one
# C-level getter for all of them. A snapshot holds thousands of nodes of a handful of classes;
# a per-object, per-attribute Python loop was most of its cost. The names tuple is the same
# object every time, so pickle writes it once and refers to it after.
_FAST: dict[type, tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]] | None] = {}


def _fast(cls: type, obj: Any) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]] | None:
    if cls not in _FAST:
        if hasattr(obj, "__dict__") and not hasattr(cls, "__mypyc_attrs__"):
            _FAST[cls] = None
        else:
            names = _attributes(obj)
            every = operator.attrgetter(*names)
            _FAST[cls] = (names, every if len(names) > 1 else (lambda o: (every(o),)))
    return _FAST[cls]


def _rebuild(cls: type, names: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    obj = cls(*_PLACEHOLDER[cls]())
    for name, value in zip(names, values, strict=True):
        setattr(obj, name, value)
    return obj


def _index(predicates: list[ast.Predicate], tests: int) -> ClassIndex:
    index = ClassIndex()
    for pred in predicates:
        index.add(pred, {})
    index.tests = tests
    return index


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        if cls is ClassIndex:
            ids: dict[ast.Predicate, int] = obj._ids
            ordered = [pred for pred, _ in sorted(ids.items(), key=lambda kv: kv[1])]
            return (_index, (ordered, obj.tests))
        if cls in _FROZEN:
            fields = cls.__dataclass_fields__
            return (cls, tuple(getattr(obj, name) for name in fields))
        if cls in _PLACEHOLDER:
            fast = _fast(cls, obj)
            if fast is not None:
                try:
                    return (_rebuild, (cls, fast[0], fast[1](obj)))
                except AttributeError:
                    pass  # an attribute not set on this object: name by name
            names = tuple(n for n in _attributes(obj) if hasattr(obj, n))  # lazily set ones
            return (_rebuild, (cls, names, tuple(getattr(obj, n) for n in names)))
        return NotImplemented


def snapshot(engine: Engine) -> bytes:
    """The engine's whole state: registrations, partitions, buffered events, clock, timers."""
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(engine)
    return out.getvalue()


def restore(data: bytes, dead_letter: Callable[[DeadLetter], None] | None = None) -> Engine:
    engine: Engine = pickle.loads(data)
    engine.dead_letter = dead_letter or (lambda _: None)
    return engine
