"""The envelope most event lines have — the five required attributes and ``data``, nothing
else — read by msgspec straight into its fields, ``data`` kept as its JSON text.

Not compiled with the engine (mypyc compiles classes of its own, not msgspec's ``Struct``s);
eva/events.py calls :data:`decode` from its compiled loop. What this shape refuses — another
attribute, a wrong type, an empty string, malformed JSON — is not an error here: the line is
read again by the general path, which says what is wrong or keeps the extra attributes."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class Envelope(msgspec.Struct, forbid_unknown_fields=True):
    """A CloudEvent with no attribute beyond the required ones and ``data`` (msgspec checks the
    JSON of ``data`` without building it: a duplicate key, or a later key, keeps the last
    value, as json and orjson do)."""

    specversion: Literal["1.0"]
    id: NonEmpty
    source: NonEmpty
    type: NonEmpty
    time: NonEmpty
    data: msgspec.Raw = msgspec.Raw(b"")  # empty: absent


decode = msgspec.json.Decoder(Envelope).decode
DecodeError = msgspec.DecodeError  # and ValidationError, its subclass
