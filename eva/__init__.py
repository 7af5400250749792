"""EVA, the parameterized event algebra of Hinze & Voisard (2014).

Parse profiles with :func:`parse`, evaluate them definitionally with
:func:`eva.reference.evaluate` or incrementally with :class:`eva.engine.Engine`.
"""

from eva.events import Event
from eva.parser import ProfileError, parse
from eva.printer import to_text

__all__ = ["Event", "ProfileError", "parse", "to_text"]
