"""Typed params of the MCPL methods a connector sends us, decoded tolerantly.

Unknown members are ignored (a newer peer may send more); a wrong type for a
member we need is a -32602. A batch is decoded in two steps so one bad
message is refused on its own instead of failing the whole request.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
from msgspec import Raw, UnsetType

from .errors import ConnectorProtocolError, invalid_params

T = TypeVar("T")


class Tolerant(msgspec.Struct, kw_only=True):
    """Base for wire params: unknown members ignored."""


class IncomingBatch(Tolerant):
    messages: list[Any]


class Author(Tolerant):
    id: str | int | None = None
    name: str | None = None


class IncomingMessage(Tolerant):
    channelId: str
    messageId: str
    content: list[dict[str, Any]]
    threadId: str | None = None
    replyTo: str | None = None
    author: Author | None = None
    timestamp: str | None = None
    metadata: dict[str, Any] | None = None
    tags: list[str] = []


class WellFormedBatch(Tolerant):
    """A batch whose every message decodes: the common case, decoded in one C-level pass."""

    messages: list[IncomingMessage]


class Payload(Tolerant):
    content: list[dict[str, Any]]


class PushEvent(Tolerant):
    featureSet: str
    eventId: str
    timestamp: str
    payload: Payload
    origin: dict[str, Any] | None = None
    tags: list[str] = []


class Register(Tolerant):
    channels: list[Any]


class Changed(Tolerant):
    added: list[Any] = []
    removed: list[Any] = []
    updated: list[Any] = []


class ManifestChanged(Tolerant, forbid_unknown_fields=True):
    # The schema forbids any other member (docs/connectors.md).
    revision: str
    domains: list[str]


class InferenceRequest(msgspec.Struct, frozen=True, kw_only=True):
    """`inference/request` params (docs/connectors.md); unknown fields are tolerated."""

    featureSet: str
    messages: list[Any]
    conversationId: str | None = None
    stream: bool = False
    preferences: dict[str, Any] | None = None


class Receipt(Tolerant):
    accepted: bool
    fallback: str | None = None
    mode: str | None = None
    unavailableFeatures: list[Any] = []
    missingCapabilities: list[Any] = []
    notes: list[Any] = []
    reason: str | None = None


class InitializeResult(Tolerant):
    capabilities: dict[str, Any] = {}
    serverInfo: dict[str, Any] | None = None
    protocolVersion: str | None = None


#: The whole value, when a problem is not inside one member.
WHOLE = "$"
_MISSING = re.compile(r"Object missing required field `(?P<name>[^`]*)`")


def describe(exc: msgspec.ValidationError) -> tuple[str, str]:
    """(field, problem) from a validation error: `("content[0]", "expected object, got int")`.

    The field is msgspec's JSON path without its `$.` root (`$` for the
    whole value); the problem is its message without the path.
    """
    message, _, where = str(exc).partition(" - at `")
    path = where.rstrip("`").removeprefix("$").removeprefix(".")
    missing = _MISSING.fullmatch(message)
    if missing is not None:
        name = missing["name"]
        return (f"{path}.{name}" if path else name), "required member missing"
    problem = message.replace("`", "")
    return path or WHOLE, problem[:1].lower() + problem[1:]


def decode_params(params: Raw | UnsetType, kind: type[T], method: str) -> T:
    """Decode `params` into `kind`, or raise -32602 naming the field and the problem in its data.

    A Raw comes from a line that already decoded as JSON, so only a
    validation error can happen here.
    """
    raw = bytes(params) if isinstance(params, Raw) else b"{}"
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        field, problem = describe(exc)
        raise invalid_params(f"invalid params for {method}: {exc}", {"field": field, "problem": problem}) from None


def decode_incoming(params: Raw | UnsetType, method: str) -> IncomingBatch | WellFormedBatch:
    """A channels/incoming batch: typed in one pass, or (some message is bad) message by message."""
    if isinstance(params, Raw):
        try:
            return msgspec.json.decode(bytes(params), type=WellFormedBatch)
        except msgspec.ValidationError:
            pass  # judged one message at a time, so the good ones still get in
    return decode_params(params, IncomingBatch, method)


def convert(value: Any, kind: type[T]) -> T | ConnectorProtocolError:
    """Convert one decoded item (a batch element); return the -32602, with field and problem, instead of raising."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        field, problem = describe(exc)
        return invalid_params(str(exc), {"field": field, "problem": problem})
