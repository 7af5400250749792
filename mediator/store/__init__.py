"""Open a store by URL: ``open_store("sqlite:///var/lib/evamed.db")``.

Accepted: ``sqlite:///abs/path.db``, ``sqlite://relative.db`` (optionally
``?synchronous=full``), a bare file path (SQLite), ``redis://[:password@]host[:port][/db]``
(or ``rediss://``, TLS; optionally ``?prefix=evamed:``). Anything else is a ValueError saying
what was found and what is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs

from mediator.store.base import (
    ClientRecord,
    LoggedEvent,
    LoggedNotification,
    RetentionError,
    Store,
    StoreError,
    SubscriptionRecord,
)
from mediator.store.redis import SCHEMES as REDIS_SCHEMES
from mediator.store.redis import RedisStore, redis_options
from mediator.store.sqlite import SqliteStore, Synchronous

__all__ = ["ClientRecord", "LoggedEvent", "LoggedNotification", "RedisStore", "RetentionError",
           "SqliteStore", "Store", "StoreError", "StoreURL", "SubscriptionRecord", "open_store",
           "parse_store_url"]

EXPECTED = ("expected sqlite:///abs/path.db, sqlite://relative.db, a file path, or "
            "redis://host:port/db")


@dataclass(frozen=True)
class StoreURL:
    """What a store URL names, checked, before anything is opened or connected."""
    kind: Literal["sqlite", "redis"]
    target: str                   # the SQLite file, or the Redis URL as given
    synchronous: Synchronous = "NORMAL"


def _sqlite(path: str, query: str, url: str) -> StoreURL:
    if not path or path.endswith("/"):
        raise ValueError(f"the store URL {url!r} names no SQLite file; {EXPECTED}")
    if "\0" in path:
        raise ValueError(f"the SQLite file name in {url!r} contains a NUL character")
    try:
        options = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"the query of {url!r} is not name=value; expected ?synchronous=full "
                         "or ?synchronous=normal") from None
    synchronous = options.pop("synchronous", ["normal"])
    if options or len(synchronous) != 1 or synchronous[0].upper() not in ("NORMAL", "FULL"):
        raise ValueError(f"the query of {url!r} is not understood; a SQLite store takes only "
                         "?synchronous=normal (the default) or ?synchronous=full")
    return StoreURL("sqlite", path, "FULL" if synchronous[0].upper() == "FULL" else "NORMAL")


def parse_store_url(url: str) -> StoreURL:
    """The store a URL names; ValueError with what was found and what is accepted."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        # a bare path; "host:6379" or "redis:/x" is a URL gone wrong, not a file name
        if not url.strip():
            raise ValueError(f"the store URL is empty; {EXPECTED}")
        if ":" in url.split("/", 1)[0]:
            raise ValueError(f"the store URL {url!r} looks like a URL without '//' "
                             f"(write ./{url} for a file of that name); {EXPECTED}")
        return _sqlite(url, "", url)
    if scheme.lower() == "sqlite":
        path, _, query = rest.partition("?")
        return _sqlite(path, query, url)
    if scheme.lower() in REDIS_SCHEMES:
        redis_options(url)
        return StoreURL("redis", url)
    raise ValueError(f"the store URL {url.split('://')[0]!r}:// is not a store scheme; {EXPECTED}")


def open_store(url: str) -> Store:
    """Open (and create, the first time) the store a URL names. ValueError for a URL that names
    none; StoreError when the store cannot be opened (a directory that does not exist, a Redis
    server that does not answer)."""
    parsed = parse_store_url(url)
    if parsed.kind == "redis":
        return RedisStore(parsed.target)
    return SqliteStore(parsed.target, synchronous=parsed.synchronous)
