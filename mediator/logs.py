"""The mediator's logging: plain lines for a terminal, or one JSON object per line for a log
collector (``log_json``); secrets never appear in either.

The code never logs a token (authentication logs the client's name, or that a token was
refused); :class:`Redact` is the second line of defence, on the handler: anything shaped like a
bearer token (``evm_…``, ``Bearer …``) or a password in a URL (``redis://:pw@host``) in a
message or its arguments is replaced before it is written, whichever library logged it.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import TextIO

REDACTED = "[redacted]"
_GAP = (r"(?:\s|\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}|\\U[0-9a-fA-F]{8}|\\[0-7]{3}|\\[nrtv]"
        r"|%[0-9a-fA-F]{2}|&[#\w]+;|[^\w\\'\"])+")
"""What may stand between ``Bearer`` and the token as a log line shows it: white space of any
kind, and its escaped forms — ``\xa0`` in the repr of Latin-1 bytes (grpc logs an undecodable
header that way), ``\xc2\xa0`` of UTF-8 ones, ``\u00a0``, ``%C2%A0``, ``&nbsp;`` —, or any
other punctuation."""
SECRETS = (
    # an authorization header, however its separator is written
    (re.compile(r"(?i)\b(bearer" + _GAP + r")[^\s'\",;]+"), rf"\1{REDACTED}"),
    # a token (security.py) wherever it stands: an escape before it (``\xa0evm_…``) leaves no
    # word boundary
    (re.compile(r"evm_[A-Za-z0-9_-]+"), REDACTED),
    # a URL's password (Redis), also one holding '/' (which is how one leaked)
    (re.compile(r"(://[^\s/@:'\"]*:)[^\s@'\"]+@"), rf"\1{REDACTED}@"),
    # a configuration's password field (a dataclass's repr, a TOML line)
    (re.compile(r"(?i)(password\s*[=:]\s*)('[^']*'|\"[^\"]*\"|[^\s,)]+)"), rf"\1{REDACTED}"),
)


def redact(text: str) -> str:
    for pattern, replacement in SECRETS:
        text = pattern.sub(replacement, text)
    return text


class Redact(logging.Filter):
    """Replaces secrets in a record's message (formatted once here, so the arguments that held
    them are gone too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_text is None and record.exc_info[0] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (RFC 3339, UTC), level, logger, message, and the
    exception's traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry = {"time": f"{stamp}.{int(record.msecs):03d}Z", "level": record.levelname,
                 "logger": record.name, "message": record.getMessage()}
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False)


def setup(json_lines: bool = False, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Configure the root logger once for ``evamed serve`` (a second call replaces the handler
    the first one installed)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(Redact())
    handler.set_name("evamed")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "evamed"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # py4j (Spark's bridge) logs each callback connection at INFO: its own warnings only.
    logging.getLogger("py4j").setLevel(max(logging.WARNING, root.level))


__all__ = ["JsonFormatter", "Redact", "redact", "setup"]
