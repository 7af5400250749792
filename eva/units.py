"""Time units of the profile language, in microseconds."""

import re

UNITS: dict[str, int] = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "min": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
    "weeks": 604_800_000_000,
}

MAX_SPAN = 2**60
"""The longest finite span, in µs (about 36,500 years): an event time (years 1–9999) plus or
minus a span stays in 64 bits and inside the engine's ±2^62 sentinels (docs/language.md, Limits)."""

_SPAN = re.compile(r"([0-9]+)([a-z]+)")


def parse_span(text: str) -> int | None:
    """``5min`` → 300000000; ``inf`` → None.

    Raises ValueError, saying what was expected, for an unknown unit or a span past MAX_SPAN.
    """
    if text == "inf":
        return None
    shape = _SPAN.fullmatch(text)
    if shape is None or shape.group(2) not in UNITS:
        raise ValueError(f"found {text!r}, expected digits and a unit: {', '.join(UNITS)}")
    # Counting digits first: int() refuses over 4,300 of them, and a bound is due anyway.
    digits = shape.group(1).lstrip("0") or "0"
    if len(digits) > 19 or int(digits) * UNITS[shape.group(2)] > MAX_SPAN:
        raise ValueError(f"found the span {_short(text)}, expected at most "
                         f"{MAX_SPAN // UNITS['weeks']}weeks ({MAX_SPAN}us, about 36,500 years)")
    return int(digits) * UNITS[shape.group(2)]


def _short(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:10]}…{text[-10:]}"


def format_span(micros: int | None) -> str:
    """The largest unit that divides the span exactly, so the text parses back to the same value."""
    if micros is None:
        return "inf"
    if micros == 0:
        return "0s"
    for unit, size in sorted(UNITS.items(), key=lambda kv: -kv[1]):
        if micros % size == 0:
            return f"{micros // size}{unit}"
    raise AssertionError("unreachable: 'us' divides every integer")
