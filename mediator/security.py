"""Bearer tokens: issued by ``evamed clients add NAME``, kept only as their SHA-256.

A token is ``evm_`` + 32 random bytes (``secrets.token_urlsafe``), shown once when the client is
added. The store keeps its hex SHA-256, so a copy of the store (a backup, a Redis replica)
grants nothing; a plain hash is enough because the token is random, not a password (no
dictionary to guess from). A token never appears in a log or an error message: functions here
log nothing, and callers must log client names, not tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import replace
from fnmatch import fnmatchcase

from mediator.store.base import ClientRecord, Store

TOKEN_PREFIX = "evm_"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
"""A client name: letters, digits, ``. _ @ -``, at most 64 characters (it appears in keys,
logs and tables)."""


def new_token() -> str:
    # the prefix lets secret scanners (and people) recognise a leaked token
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


MAX_PATTERNS = 64
PATTERN = re.compile(r"[!-~]{1,200}")
"""A source pattern granted to a client: printable ASCII without spaces, at most 200
characters (fnmatch: ``*``, ``?``, ``[…]``)."""


def source_patterns(given: Sequence[str]) -> tuple[str, ...]:
    """The source patterns of ``--sources`` (each value may hold several, separated by spaces
    or commas). ValueError naming the first that is not one."""
    patterns = tuple(p for value in given for p in re.split(r"[\s,]+", value) if p)
    for pattern in patterns:
        if not PATTERN.fullmatch(pattern):
            raise ValueError(f"a source pattern is 1 to 200 printable ASCII characters without "
                             f"spaces, got {pattern[:60]!r}")
    if len(patterns) > MAX_PATTERNS:
        raise ValueError(f"at most {MAX_PATTERNS} source patterns, got {len(patterns)}")
    return patterns


def may_publish(granted: Sequence[str], source: str) -> bool:
    """Whether a client granted ``granted`` may publish an event of ``source`` (case matters:
    CloudEvents sources are URIs)."""
    return any(fnmatchcase(source, pattern) for pattern in granted)


def add_client(store: Store, name: str, *, inherit: bool = False, operator: bool = False,
               sources: Sequence[str] = ()) -> str:
    """Register a client and return its token (the only time it is seen); an ``operator`` sees
    every dead letter, may republish any and send ``advance_to_us`` (docs/operations.md,
    "Secure"). ``sources``: the event sources it may publish under (fnmatch patterns; none
    given: every source for an operator, else its own name and what lies below it,
    ``NAME`` and ``NAME/*``). ValueError for a name that is not a client name or belongs to a
    client that is not revoked. A revoked client's
    name can be issued again, with a new token — but the holder of the name reads the
    subscriptions stored under it, so while it owns any, only with ``inherit`` (a rotation: the
    same client, a new token), never by accident to someone else."""
    if not NAME.fullmatch(name):
        raise ValueError(f"a client name is 1 to 64 letters, digits or . _ @ - (starting with a "
                         f"letter or digit), got {name!r}")
    existing = store.client(name)
    if existing is not None and not existing.revoked:
        raise ValueError(f"client {name!r} already exists; revoke it first "
                         f"(evamed clients revoke {name}) to issue a new token")
    owned = store.count_subscriptions(name) if existing is not None else 0
    if owned and not inherit:
        raise ValueError(f"client {name!r} was revoked and still owns {owned} subscription(s), "
                         f"which the new holder of the name would read: give --inherit to issue "
                         f"a new token to the same client, or remove them first")
    patterns = source_patterns(sources)
    token = new_token()
    store.put_client(ClientRecord(name, hash_token(token), time.time_ns() // 1000,
                                  operator=operator, sources=patterns))
    return token


def authenticate(store: Store, token: str) -> ClientRecord | None:
    """The client a bearer token belongs to, or None (unknown, revoked, malformed)."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    digest = hash_token(token)
    record = store.client_by_token_hash(digest)
    # The lookup compares hashes (timing reveals nothing about the token: finding a token for a
    # given hash prefix is a preimage search); compare_digest keeps this check constant-time
    # anyway, whatever a store's lookup does.
    if record is None or record.revoked or not hmac.compare_digest(record.token_hash, digest):
        return None
    return record


def revoke_client(store: Store, name: str) -> bool:
    """Revoke a client's token; False when there is no such client or it is already revoked.
    Its subscriptions stay (the operator removes them; they are the client's data)."""
    record = store.client(name)
    if record is None or record.revoked:
        return False
    store.put_client(replace(record, revoked=True))
    return True
