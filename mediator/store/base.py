"""The mediator's stores (the paper's client and profile stores, EVA §5.3), behind one interface.

What is kept: clients (their tokens hashed), subscriptions (a profile document as written, its
owner, where it starts in the event log and in each link log, its plans as explained), the
**event log** (every accepted event, in arrival order: what the pipeline evaluates, and replays
after a restart), one **link log** per autonomous service (every message its session sent,
appended before it is acknowledged to the service: the notifications the mediator composes),
one **notification log** per subscription (every composite appended before it is sent; a
resume token is a position in it) and the **composer log** (the merged trace of what the Spark
composer's plans need, in trace order, each release closed by a watermark line: what its jobs
read, and what their composites' notifications say of each constituent). Two
implementations: :mod:`mediator.store.sqlite` (embedded, one file, WAL) and
:mod:`mediator.store.redis` (deployed). Positions are integers from 1, increasing by one per
append, in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol


@dataclass(frozen=True)
class ClientRecord:
    name: str
    token_hash: str      # sha256 of the bearer token (mediator/security.py), never the token
    created_us: int
    revoked: bool = False
    operator: bool = False  # sees every dead letter, republishes any (not only its own)
    sources: tuple[str, ...] = ()  # the event sources it may publish under (fnmatch patterns);
    # () — a record written before grants existed, or none given —: mediator/security.py's default

    @property
    def granted(self) -> tuple[str, ...]:
        """The source patterns it may publish under: its grant, else every source for an
        operator and, for any other client, its own name and what lies below it."""
        if self.sources:
            return self.sources
        return ("*",) if self.operator else (self.name, self.name + "/*")


@dataclass(frozen=True)
class SubscriptionRecord:
    owner: str           # the client's name
    name: str            # unique per owner
    text: str            # the profile document as written
    created_us: int
    start_position: int  # the event-log position it starts after (it sees the events after it)
    start_time: int | None  # the newest event time when it was registered (None: no event yet)
    plans: str = ""      # the plans as explained (JSON), for ListProfiles/Explain
    links: str = ""      # JSON {link: position}: where it starts in each link log it reads


class LoggedEvent(NamedTuple):
    """An event-log entry. (A tuple: the pipeline reads one per event, and a frozen
    dataclass's constructor cost a tenth of its read.)"""

    position: int
    line: str            # the CloudEvent as JSON, as accepted


@dataclass(frozen=True)
class LoggedMessage:
    position: int
    number: int          # the service's number of the message (its session's seq)
    payload: bytes       # the message as mediator/inputs.py writes it


@dataclass(frozen=True)
class ComposerLine:
    """A line of the composer log (mediator/placement.py ``SparkFeed`` writes it, the Spark
    jobs read ``line``): an event — its CloudEvent as JSON, and what a notification says of it
    (source, id, type, time, and the (service, handle) pairs whose filters named it; none: the
    mediator's own feed) — or a **watermark line** (``id`` empty; ``line`` as
    spark_jobs.processor.watermark_line writes it): every instant up to ``time`` is complete.
    ``position`` is 0 until appended."""

    line: str
    time: int
    source: str = ""
    id: str = ""
    type: str = ""
    via: tuple[tuple[str, str], ...] = ()
    position: int = 0


@dataclass(frozen=True)
class LoggedNotification:
    position: int
    composite_id: str
    payload: bytes       # the Notification message's fields as JSON (mediator/delivery.py)


@dataclass(frozen=True)
class DeadLetterRecord:
    """A refused input, kept in the dead-letter log (mediator/dead_letters.py writes it).
    ``source``: where it came in — ``publish``, a ``[[sources]]`` name, ``mediator`` (the
    event log's reader) or the service that reported it; ``client``: who published it (Publish,
    a republish); ``where``: the broker's topic or stream entry, the index in a Publish call,
    an event-log position; ``raw``: the input as it came, at most the configured bound
    (``size``: its whole size); ``kind``: what ``raw`` is — ``cloudevent`` (a CloudEvents
    line), ``payload`` (a broker's message payload, mapped by the source's rules) or
    ``report`` (a service's detection: not republishable). ``position`` is 0 until appended;
    ``republished_us``: when it was published again (0: never)."""

    reason: str
    source: str
    detail: str
    time_us: int
    client: str = ""
    where: str = ""
    event_id: str = ""
    raw: bytes = b""
    size: int = 0
    kind: str = "cloudevent"
    position: int = 0
    republished_us: int = 0


class RetentionError(LookupError):
    """A resume position older than what the log keeps."""


class StoreError(RuntimeError):
    """The store cannot be opened or used: a file that cannot be opened, a Redis server that does
    not answer, a schema version this code does not know. The message names the store and says
    what was found; never a credential."""


SCHEMA_VERSION = 1
"""The layout both stores write; a store written by a newer layout is refused (StoreError)."""


def check_read(after: int, limit: int) -> None:
    """The arguments of a log read: a position from 0 (0 = from the start), a limit from 1."""
    if after < 0:
        raise ValueError(f"a log position is 0 or more, got {after}")
    if limit < 1:
        raise ValueError(f"a read limit is 1 or more, got {limit}")


def check_retention(owner: str, name: str, after: int, first: int, head: int,
                    kept: int | None) -> None:
    """Refuse reading after ``after`` when entries after it were trimmed: the first kept position
    (``head + 1`` when all were trimmed) is past ``after + 1``. ``kept`` is the retention of the
    last trim (for the message)."""
    oldest = first if first else head + 1
    if after < oldest - 1:
        keeps = f"the log keeps the newest {kept}" if kept is not None else "older ones were trimmed"
        raise RetentionError(
            f"resume token position {after} of subscription {owner}/{name} is older than the "
            f"oldest kept, {oldest}; {keeps} (subscribe without a token to start at the oldest)")


class Store(Protocol):
    # -- clients
    def put_client(self, record: ClientRecord) -> None: ...
    def client(self, name: str) -> ClientRecord | None: ...
    def client_by_token_hash(self, token_hash: str) -> ClientRecord | None: ...
    def clients(self) -> list[ClientRecord]: ...

    # -- subscriptions
    def put_subscription(self, record: SubscriptionRecord) -> None: ...
    def subscription(self, owner: str, name: str) -> SubscriptionRecord | None: ...
    def subscriptions(self, owner: str | None = None) -> list[SubscriptionRecord]: ...
    def count_subscriptions(self, owner: str) -> int:
        """How many subscriptions ``owner`` has (the limit per client), without reading them:
        its cost does not grow with the count."""
        ...
    def delete_subscription(self, owner: str, name: str) -> bool:
        """Remove the record, its notification log and its composite ids (a subscription added
        again under the name starts a new log at position 1)."""
        ...

    # -- the event log
    def append_events(self, lines: Sequence[str]) -> int:
        """Append in order, durably; returns the position of the last one (the head)."""
        ...
    def read_events(self, after: int, limit: int = 1000) -> list[LoggedEvent]: ...
    def event_head(self) -> int: ...
    def trim_events(self, before: int) -> int:
        """Drop events at positions < ``before``; returns how many were dropped."""
        ...

    # -- link logs, one per autonomous service
    def append_link(self, link: str, items: Sequence[tuple[int, bytes]]) -> tuple[int, int]:
        """Append (message number, payload) pairs in order, durably, skipping any whose number
        is not after the newest appended (a message the service sent again after a reconnect);
        returns the log's bounds after it (:meth:`link_bounds`: the newest number is what the
        mediator may acknowledge)."""
        ...
    def read_link(self, link: str, after: int, limit: int = 1000) -> list[LoggedMessage]: ...
    def link_bounds(self, link: str) -> tuple[int, int]:
        """(head position, newest message number); (0, 0) for a log nothing was appended to."""
        ...
    def renumber_link(self, link: str) -> None:
        """The service numbers its messages from 1 again (its session was lost and opened
        anew): the next append takes any number; positions go on."""
        ...
    def trim_link(self, link: str, before: int) -> int:
        """Drop the entries at positions < ``before``; returns how many were dropped."""
        ...

    # -- the composer log (the Spark composer's input)
    def append_composer(self, lines: Sequence[ComposerLine]) -> int:
        """Append in order, durably, as one transaction (a reader sees all of them or none);
        returns the head."""
        ...
    def read_composer(self, after: int, limit: int = 1000) -> list[ComposerLine]: ...
    def composer_head(self) -> int: ...
    def composer_events(self, keys: Sequence[tuple[str, str]]
                        ) -> dict[tuple[str, str], ComposerLine]:
        """The event lines kept for each (source, id) (a source "": the newest line of that
        id, whatever its source); a key not kept is left out."""
        ...
    def trim_composer(self, before: int) -> int:
        """Drop the lines at positions < ``before``; returns how many were dropped."""
        ...

    # -- notification logs, one per (owner, name)
    def append_notifications(self, owner: str, name: str,
                             items: Sequence[tuple[str, bytes]]) -> list[LoggedNotification]:
        """Append (composite id, payload) pairs in order, skipping an id the log already holds
        (a composite reported again, e.g. replayed after a restart): returns what was appended.
        The ids are remembered until the subscription is deleted, also after their entries were
        trimmed. Nothing is appended for a subscription that is not stored (deleted meanwhile):
        its log goes with the record."""
        ...
    def read_notifications(self, owner: str, name: str, after: int,
                           limit: int = 1000) -> list[LoggedNotification]:
        """What was appended after position ``after`` (0: from the first), at most ``limit``,
        in position order; RetentionError when ``after`` is older than the first position kept
        minus one (what lies between was trimmed). An unknown subscription reads as empty."""
        ...
    def notification_bounds(self, owner: str, name: str) -> tuple[int, int]:
        """(first position kept, head); (0, 0) for a log nothing was appended to (or an
        unknown subscription); (head + 1, head) when every entry was trimmed."""
        ...
    def trim_notifications(self, owner: str, name: str, keep: int) -> int:
        """Keep the newest ``keep`` entries; returns how many were dropped."""
        ...

    # -- checkpoints of the pipeline (mediator/checkpoints.py)
    def put_checkpoint(self, data: bytes, keep: int = 2) -> int:
        """Keep ``data`` as the newest checkpoint, and the ``keep`` newest in all; its number
        (increasing)."""
        ...
    def checkpoints(self) -> list[tuple[int, bytes]]:
        """The kept checkpoints, newest first."""
        ...
    # -- the dead-letter log (every refused input, with its reason: mediator/dead_letters.py)
    def append_dead_letters(self, records: Sequence[DeadLetterRecord]) -> int:
        """Append in order, durably; returns the head (positions from 1, never reused)."""
        ...
    def read_dead_letters(self, after: int, limit: int = 1000, *, reason: str = "",
                          source: str = "", client: str = "") -> list[DeadLetterRecord]:
        """The letters after position ``after``, oldest first, at most ``limit``; only those of
        ``reason``, ``source``, ``client`` where given."""
        ...
    def dead_letter_bounds(self) -> tuple[int, int]:
        """(first position kept, head); (0, 0) when none was ever appended."""
        ...
    def mark_republished(self, position: int, time_us: int) -> bool:
        """Note that the letter at ``position`` was published again; False if it is not kept."""
        ...
    def trim_dead_letters(self, keep: int) -> int:
        """Keep the newest ``keep`` letters; returns how many were dropped."""
        ...

    # -- key-value settings the service keeps (e.g. the pipeline's newest event time)
    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...

    def close(self) -> None: ...


def unwrapped(store: Store) -> Store:
    """The store itself, not a :class:`Waiting` view of it (its kind decides where the Spark
    composer reads)."""
    return store.inner if isinstance(store, Waiting) else store


class Waiting:
    """A store that waits out an outage: every call that fails with :class:`StoreError` is
    tried again (after 0.1 s, doubling to 2 s) until the store answers, or until
    :meth:`abandon` — then the error is raised. For the pipeline's thread: a round that
    stopped half-way on a store error could not be resumed, so it waits inside the call
    instead, with its state as it was (docs/operations.md, "Stop"). ``down`` is the error
    while the store does not answer (None once it does)."""

    def __init__(self, store: Store) -> None:
        import threading

        self._store = store
        self._abandoned = threading.Event()
        self.down: StoreError | None = None

    @property
    def inner(self) -> Store:
        """The store waited on (what its kind is: SQLite, Redis)."""
        return self._store

    def abandon(self) -> None:
        """Stop waiting: a call waiting now, or failing later, raises its error."""
        self._abandoned.set()

    def __getattr__(self, name: str) -> Any:
        import functools
        import logging

        found = getattr(self._store, name)
        if not callable(found):
            return found

        @functools.wraps(found)
        def call(*args: Any, **kwargs: Any) -> Any:
            pause = 0.1
            while True:
                try:
                    result = found(*args, **kwargs)
                except StoreError as exc:
                    if self._abandoned.is_set():
                        raise
                    if self.down is None:
                        logging.getLogger("evamed.store").error(
                            "the store does not answer (%s): the pipeline waits for it", exc)
                    self.down = exc
                    self._abandoned.wait(pause)
                    pause = min(2 * pause, 2.0)
                    continue
                if self.down is not None:
                    self.down = None
                    logging.getLogger("evamed.store").warning(
                        "the store answers again: the pipeline goes on")
                return result
        self.__dict__[name] = call  # made once per method: found directly from then on
        return call
