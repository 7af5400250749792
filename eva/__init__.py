"""EVA, the parameterized event algebra of Hinze & Voisard (2014).

    doc = eva.parse(text)                          # profiles and classes (eva.ast)
    spec = eva.compile(profile, ...)               # once per profile: immutable node specs
    engine = eva.Engine(); engine.add_document(doc)
    notifications = engine.push(event)             # incremental (compiles on registration)
    notifications = eva.evaluate(doc, events)      # the definition, over a finite trace

``eva.reference`` is the definitional evaluator, ``eva.engine`` the incremental one, tested equal
to it. The names load on first use: ``import eva`` itself imports nothing heavy.
"""

from __future__ import annotations

from eva.lazy import exports

_EXPORTS: dict[str, tuple[str, str | None]] = {
    "reference": ("eva.reference", None),
    "Event": ("eva.events", "Event"),
    "ProfileError": ("eva.parser", "ProfileError"),
    "parse": ("eva.parser", "parse"),
    "to_text": ("eva.printer", "to_text"),
    # The module is eva.compiler: a submodule eva.compile would rebind this name on import.
    "compile": ("eva.compiler", "compile_profile"),
    "Engine": ("eva.engine", "Engine"),
    "EngineConfig": ("eva.engine", "EngineConfig"),
    "evaluate": ("eva.reference", "evaluate"),
}


__getattr__ = exports("eva", _EXPORTS, globals())


__all__ = ["Engine", "EngineConfig", "Event", "ProfileError", "compile", "evaluate", "parse",
           "reference", "to_text"]
