"""EVA, the parameterized event algebra of Hinze & Voisard (2014).

Parse profiles with :func:`parse`, evaluate them definitionally with
:func:`mediator.eva.reference.evaluate` or incrementally with :class:`mediator.eva.engine.Engine`.
"""

from mediator.eva.events import Event
from mediator.eva.parser import ProfileError, parse
from mediator.eva.printer import to_text

__all__ = ["Event", "ProfileError", "parse", "to_text"]
