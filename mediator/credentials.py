"""Saved bearer tokens: what lets every shell (and every program using the public client) talk
to a mediator without passing the token around.

``evamed clients add NAME --save`` writes the new token here, under the address of the
mediator it is for; the commands that talk to a mediator (and :class:`mediator.client.
MediatorClient` without a token) read it when neither ``--token`` nor ``EVAMED_TOKEN`` gives
one. The file is TOML, one table per address, readable by its owner only (mode 0600)::

    ["127.0.0.1:50060"]
    client = "alice"
    token = "evm_…"

Where: ``EVAMED_CREDENTIALS``, else ``$XDG_CONFIG_HOME/evamed/credentials.toml``, else
``~/.config/evamed/credentials.toml``. Standard library only: the CLI imports it at start-up.
"""

from __future__ import annotations

import json
import os
import tempfile
import tomllib
from pathlib import Path

ENV = "EVAMED_CREDENTIALS"


def path() -> Path:
    """The credentials file (which need not exist)."""
    given = os.environ.get(ENV)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "evamed" / "credentials.toml"


def _read(file: Path) -> dict[str, dict[str, str]]:
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"the credentials file {file} cannot be read: {exc}") from None
    return {address: {k: str(v) for k, v in entry.items()} for address, entry in data.items()
            if isinstance(entry, dict)}


def token_for(address: str) -> str | None:
    """The token saved for the mediator at ``address`` (host:port), or None. ValueError when
    the file exists but cannot be read."""
    entry = _read(path()).get(address)
    return entry.get("token") if entry else None


def save(address: str, client: str, token: str) -> Path:
    """Save ``client``'s token for the mediator at ``address`` (replacing what was saved for
    that address); the file is written whole and renamed into place, mode 0600. Returns it."""
    file = path()
    entries = _read(file)
    entries[address] = {"client": client, "token": token}
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = ("# evamed credentials: a bearer token per mediator address "
            "(evamed clients add NAME --save)\n")
    for where, entry in entries.items():
        text += f"\n[{json.dumps(where)}]\n" + "".join(
            f"{key} = {json.dumps(value)}\n" for key, value in entry.items())
    handle, temporary = tempfile.mkstemp(dir=file.parent, prefix=".credentials-")
    try:
        os.fchmod(handle, 0o600)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, file)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return file


def local_address(listen: str) -> str:
    """The address a client on this machine reaches a mediator listening on ``listen`` at:
    the same, with a wildcard host (``0.0.0.0``, ``::``, ``[::]``) as the loopback."""
    host, _, port = listen.rpartition(":")
    if host in ("0.0.0.0", "", "::", "[::]"):
        host = "127.0.0.1"
    return f"{host}:{port}"


__all__ = ["ENV", "local_address", "path", "save", "token_for"]
