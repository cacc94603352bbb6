"""The control socket's protocol: one JSON request line, one JSON answer line, then the daemon closes.

    {"command": "status"}                          → {"ok": true, "status": {...}, "problems": [...]}
    {"command": "restart-connector", "name": "x"}  → {"ok": true}
    anything else                                  → {"ok": false, "error": "what is wrong"}

Both sides bound what they read (`MAX_REQUEST_BYTES`, `MAX_ANSWER_BYTES`):
the socket is the owner's only, but a confused client must not make the
daemon buffer without end, nor a confused daemon the client.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, Meta, UnsetType

#: A request is a command and at most a connector name: a few hundred bytes. A longer line is refused unread.
MAX_REQUEST_BYTES = 4096
#: An answer is the status object: ~300 bytes per connector or agent. 16 MiB is thousands of them.
MAX_ANSWER_BYTES = 16 << 20


class StatusRequest(msgspec.Struct, frozen=True, tag="status", tag_field="command", forbid_unknown_fields=True):
    """`mcplhost status`: the status object and the `--check` problems."""


class RestartRequest(msgspec.Struct, frozen=True, tag="restart-connector", tag_field="command",
                     forbid_unknown_fields=True):
    """`mcplhost restart-connector NAME`."""

    name: Annotated[str, Meta(min_length=1, max_length=256)]


Request = StatusRequest | RestartRequest


class Answer(msgspec.Struct, frozen=True, omit_defaults=True):
    """The daemon's one answer; `status` is the status object as the daemon encoded it (absent: not asked)."""

    ok: bool
    error: str | None = None
    status: msgspec.Raw | UnsetType = UNSET
    problems: list[str] = []


class WireError(Exception):
    """A line that is not a request or answer of this protocol; the text says why."""


_request_decoder = msgspec.json.Decoder(Request)
_answer_decoder = msgspec.json.Decoder(Answer)
_encoder = msgspec.json.Encoder()


def encode(message: Request | Answer) -> bytes:
    """One line, newline included."""
    return _encoder.encode(message) + b"\n"


def decode_request(line: bytes) -> Request:
    try:
        return _request_decoder.decode(line)
    except msgspec.DecodeError as exc:  # ValidationError is one: a wrong command or field says which
        raise WireError(f"not a control request: {exc}") from None


def decode_answer(line: bytes) -> Answer:
    try:
        return _answer_decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise WireError(f"the daemon's answer is not one this mcplhost reads: {exc}") from None
