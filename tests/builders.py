"""The suite's builders of wire messages, admitted items and wakes: each defined here once.

    steps = [register("disc:g1:room"), incoming(message("disc:g1:room", "m-1", "hi", tags=["chat:addressed"]))]
    spec = scripted("disc", {"manifest": CHAT_MANIFEST, "steps": steps}, tmp_path, grant=CHAT_GRANT)

What a connector sends (`message`, `incoming`, `register`, `descriptor`,
`push`: plain JSON, as the scripted connector's steps carry it), what
admission hands ingest (`admitted_message`, `admitted_push`), content blocks
(`text`, `texts`, `text_of`) and an agent's wake (`wake_of`). A file passes what its case
needs (`author=`, `tags=`, ...) rather than defining its own variant.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mcplhost.agents.wakes.rules import Wake
from mcplhost.protocol.intake import AdmittedMessage, AdmittedPush

#: The author of `message` unless a test names another.
ALICE: dict[str, Any] = {"id": "u1", "name": "Alice"}
#: The channel `admitted_message` is in unless a test names another.
ROOM = "disc:g1:room"
#: Every builder's source timestamp.
TIMESTAMP = "2026-01-01T00:00:00Z"


def text(body: str) -> dict[str, Any]:
    """One text content block."""
    return {"type": "text", "text": body}


def texts(blocks: Iterable[dict[str, Any]]) -> list[str]:
    """The texts of the text blocks among `blocks` (an item's or a message's content), in order."""
    return [block["text"] for block in blocks if block.get("type") == "text"]


def text_of(blocks: Iterable[dict[str, Any]]) -> str:
    """The texts of the text blocks among `blocks`, joined with nothing between them."""
    return "".join(texts(blocks))


def descriptor(channel_id: str, **extra: Any) -> dict[str, Any]:
    """A ChannelDescriptor (SPEC §14.2) for `channel_id`, bidirectional unless `extra` says otherwise.

    A member `extra` gives as None is left out (`label=None`: an unlabelled channel).
    """
    fields = {"id": channel_id, "type": "disc", "label": "#" + channel_id.rsplit(":", 1)[-1],
              "direction": "bidirectional", "address": {"channel": channel_id}, **extra}
    return {key: value for key, value in fields.items() if value is not None}


def message(channel_id: str, message_id: str = "m-1", body: str = "hello", **extra: Any) -> dict[str, Any]:
    """One `channels/incoming` message with one text block, by ALICE unless `extra` names an `author`."""
    return {"channelId": channel_id, "messageId": message_id, "author": ALICE, "timestamp": TIMESTAMP,
            "content": [text(body)], **extra}


def register(*channels: str | dict[str, Any]) -> dict[str, Any]:
    """A `channels/register` step: each channel an id (a bidirectional `descriptor`) or a whole descriptor."""
    return {"request": "channels/register",
            "params": {"channels": [descriptor(c) if isinstance(c, str) else c for c in channels]}}


def incoming(*messages: dict[str, Any]) -> dict[str, Any]:
    """A `channels/incoming` step carrying `messages`."""
    return {"request": "channels/incoming", "params": {"messages": list(messages)}}


def push(event_id: str = "e-1", feature_set: str = "chat", body: str = "ping", **extra: Any) -> dict[str, Any]:
    """`push/event` params with one text block."""
    return {"featureSet": feature_set, "eventId": event_id, "timestamp": TIMESTAMP,
            "payload": {"content": [text(body)]}, **extra}


def admitted_message(message_id: str = "m-1", body: str = "hello", *, channel_id: str = ROOM,
                     **fields: Any) -> AdmittedMessage:
    """A message as admission hands it to ingest (in ROOM, label "#room", unless `channel_id` says otherwise)."""
    return AdmittedMessage(channel_id=channel_id, label="#room", message_id=message_id, content=[text(body)], **fields)


def admitted_push(event_id: str = "e-1", body: str = "tick", **fields: Any) -> AdmittedPush:
    """A push as admission hands it to ingest (feature set "disc.alerts", no source timestamp)."""
    return AdmittedPush(event_id=event_id, feature_set="disc.alerts", source_timestamp=None, content=[text(body)],
                        **fields)


def wake_of(*ids: int, overflow: int = 0) -> Wake:
    """A wake for the items `ids`, in no conversation."""
    return Wake(item_ids=tuple(ids), overflow=overflow, conversations=(), several_conversations=False, first_at=0.0)
