"""Time units of the profile language, in microseconds."""

UNITS: dict[str, int] = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "min": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
    "weeks": 604_800_000_000,
}


def parse_span(text: str) -> int | None:
    """``5min`` → 300000000; ``inf`` → None."""
    if text == "inf":
        return None
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(digits) * UNITS[text[len(digits):]]


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
