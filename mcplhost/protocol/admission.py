"""Pure admission of inbound items: one message or one push, judged at receipt.

Nothing here waits or stores. Each function takes the connection's current
facts (grant, registry, feature sets) and returns what was admitted or the
refusal to answer with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from mcplhost.jsonobject import JsonObject

from . import errors
from .channels import ChannelRegistry
from .errors import ConnectorProtocolError
from .featuresets import FeatureSetState, check_feature_set
from .intake import AdmittedMessage, AdmittedPush
from .params import IncomingMessage, PushEvent, convert
from .tags import expand_tags

#: Members of `origin` a legacy push uses to name its place (docs/mcpl-compat.md).
ORIGIN_CHANNEL = "mcplChannelId"


class _Claims(msgspec.Struct, frozen=True, rename="camel"):
    """The members of a connector's `metadata` or `origin` object the host reads, each as sent.

    A member counts only as a string (`_claimed`): the object is the connector's own, so any other
    value is no claim, never a refusal. The object itself is stored as sent (docs/provenance.md §1).
    """

    reply_to: Any = None
    thread_id: Any = None
    message_id: Any = None
    mcpl_channel_id: Any = msgspec.field(default=None, name=ORIGIN_CHANNEL)
    source: Any = None  # a push's sender, as its origin names it


_NO_CLAIMS = _Claims()


def _claims(adapter: Mapping[str, Any] | None) -> _Claims:
    """What `adapter` claims; an absent or empty object claims nothing."""
    return msgspec.convert(adapter, _Claims) if adapter else _NO_CLAIMS


def _claimed(value: Any, *, empty: bool = False) -> str | None:
    """A claimed member when it is a string (non-empty unless `empty`), else None."""
    return value if isinstance(value, str) and (empty or value) else None


def _reply_to(own: str | None, metadata: Mapping[str, Any] | None) -> str | None:
    """The message's own replyTo, else its metadata's (docs/provenance.md §2)."""
    if own is not None:
        return own
    return _claimed(_claims(metadata).reply_to, empty=True)


def refusal(message_id: Any, error: ConnectorProtocolError, reason: str) -> JsonObject:
    """A per-message refusal in `results`, with the error code that names it.

    A malformed message also names the `field` and the `problem`, as a
    push/event -32602 does in its data.
    """
    entry: dict[str, Any] = {"accepted": False, "reason": reason, "code": error.code}
    if isinstance(message_id, str):
        entry["messageId"] = message_id
    if isinstance(error.data, dict) and "field" in error.data:
        entry["field"] = error.data["field"]
        entry["problem"] = error.data.get("problem")
    return entry


def admit_message(
    raw: Any,
    registry: ChannelRegistry,
    accepted_implies: Mapping[str, list[str]] | None,
) -> AdmittedMessage | dict[str, Any]:
    """Admit one `channels/incoming` message, or return its itemized refusal.

    The caller has checked `channels.incoming` against the current grant. The
    channel must be registered on this connection now (never the id the
    message merely claims) and must receive (not be outbound-only).
    """
    if isinstance(raw, IncomingMessage):
        message = raw  # already decoded with the whole batch
    else:
        converted = convert(raw, IncomingMessage)
        if isinstance(converted, ConnectorProtocolError):
            message_id = raw.get("messageId") if isinstance(raw, dict) else None
            return refusal(message_id, converted, "invalid_message")
        message = converted
    channel = registry.get(message.channelId)
    if channel is None:
        return refusal(message.messageId, errors.unknown_channel(message.channelId), "unknown_channel")
    if not channel.receives:
        return refusal(message.messageId, errors.channel_not_permitted(message.channelId), "channel_not_permitted")
    author = message.author
    participant = author_id = None
    if author is not None:
        author_id = str(author.id) if author.id is not None else None
        participant = author.name or author_id
    return AdmittedMessage(
        channel_id=channel.id,
        label=channel.label,
        message_id=message.messageId,
        thread_id=message.threadId,
        reply_to=_reply_to(message.replyTo, message.metadata),
        participant=participant,
        author_id=author_id,
        source_timestamp=message.timestamp,
        content=message.content,
        metadata=message.metadata,
        tags=expand_tags(message.tags, accepted_implies),
    )


def admit_push(
    push: PushEvent,
    registry: ChannelRegistry,
    feature_sets: Mapping[str, FeatureSetState],
    *,
    legacy: bool,
    accepted_implies: Mapping[str, list[str]] | None,
) -> AdmittedPush:
    """Admission steps 4-6 (declared, enabled, uses), then where the push belongs.

    The caller has checked readiness, the grant and the params. A push names
    a channel only through `origin.mcplChannelId`, and only a channel this
    connection has registered at receipt counts; otherwise it is unscoped.
    Raises the ConnectorProtocolError to answer with.
    """
    refused = check_feature_set(feature_sets, push.featureSet, "pushEvents", legacy=legacy)
    if refused is not None:
        raise refused
    origin = push.origin
    claims = _claims(origin)
    named = _claimed(claims.mcpl_channel_id, empty=True)
    channel = registry.get(named) if named else None
    return AdmittedPush(
        event_id=push.eventId,
        feature_set=push.featureSet,
        source_timestamp=push.timestamp,
        content=push.payload.content,
        origin=origin,
        tags=expand_tags(push.tags, accepted_implies),
        channel_id=channel.id if channel is not None else None,
        label=channel.label if channel is not None else None,
        thread_id=_claimed(claims.thread_id) if channel is not None else None,
        message_id=_claimed(claims.message_id),
        reply_to=_claimed(claims.reply_to),
        named_channel=named,
        participant=_claimed(claims.source, empty=True),
    )
