"""Bearer tokens (issue 13, part 6): issued once, stored hashed, refused when unknown or revoked."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from mediator.security import (
    TOKEN_PREFIX,
    add_client,
    authenticate,
    hash_token,
    new_token,
    revoke_client,
)
from mediator.store import SqliteStore
from mediator.store.base import SubscriptionRecord


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "store.db")
    yield opened
    opened.close()


def test_tokens_are_prefixed_random_and_hashed_as_sha256_hex() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(t.startswith(TOKEN_PREFIX) and len(t) == len(TOKEN_PREFIX) + 43 for t in tokens)
    assert hash_token("evm_x") == hashlib.sha256(b"evm_x").hexdigest()


def test_an_added_client_authenticates_with_its_token_and_the_store_keeps_only_the_hash(
        store: SqliteStore, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    token = add_client(store, "ann")
    record = authenticate(store, token)
    assert record is not None and record.name == "ann" and not record.revoked
    assert record.token_hash == hash_token(token) != token
    store.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert token.encode() not in stored and hash_token(token).encode() in stored
    assert token not in caplog.text


@pytest.mark.parametrize("token", ["", "evm_", "evm_unknown", "Bearer evm_x", "x" * 10_000])
def test_unknown_or_malformed_tokens_authenticate_nobody(store: SqliteStore, token: str) -> None:
    add_client(store, "ann")
    assert authenticate(store, token) is None


def test_a_revoked_client_is_refused_and_its_name_can_be_reissued(store: SqliteStore) -> None:
    old = add_client(store, "ann")
    with pytest.raises(ValueError, match="client 'ann' already exists; revoke it first"):
        add_client(store, "ann")
    assert revoke_client(store, "ann") is True
    assert revoke_client(store, "ann") is False
    assert revoke_client(store, "nobody") is False
    assert authenticate(store, old) is None
    new = add_client(store, "ann")
    assert authenticate(store, old) is None
    renewed = authenticate(store, new)
    assert renewed is not None and renewed.name == "ann"


def test_a_revoked_name_owning_subscriptions_is_reissued_only_on_purpose(
        store: SqliteStore) -> None:
    """The holder of a name reads what is stored under it: a revoked client's name that still
    owns subscriptions goes to a new token only with inherit (a rotation)."""
    add_client(store, "ann")
    store.put_subscription(SubscriptionRecord("ann", "P", "profile P = A", 0, 0, None))
    revoke_client(store, "ann")
    with pytest.raises(ValueError, match="still owns 1 subscription"):
        add_client(store, "ann")
    rotated = authenticate(store, add_client(store, "ann", inherit=True))
    assert rotated is not None and store.subscriptions("ann")[0].name == "P"


def test_each_token_authenticates_its_own_client(store: SqliteStore) -> None:
    tokens = {name: add_client(store, name) for name in ("ann", "bob")}
    found = {name: authenticate(store, token) for name, token in tokens.items()}
    assert {name: record.name if record else None for name, record in found.items()} == {
        "ann": "ann", "bob": "bob"}


@pytest.mark.parametrize("name", ["", " ann", "ann bob", "a:b", "-x", "é", "a" * 65, "a\n"])
def test_a_bad_client_name_is_refused_with_what_a_name_is(store: SqliteStore, name: str) -> None:
    with pytest.raises(ValueError, match="a client name is 1 to 64 letters, digits or"):
        add_client(store, name)
    assert store.clients() == []
