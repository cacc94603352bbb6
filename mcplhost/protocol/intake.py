"""What the protocol layer hands on after admission, and the port it hands it to.

The protocol layer decides *whether* an item is admitted and *where it came
from* (the registered channel, the label at receipt). Turning it into a
stored item (strip, freeze-source, header, mark, commit) happens behind the
`Intake` port, which host.py implements with the inbound pipeline and the
store; protocol/ never imports either.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec


class AdmittedMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One accepted `channels/incoming` message, channel resolved against the registry."""

    channel_id: str
    label: str | None
    message_id: str
    thread_id: str | None = None
    reply_to: str | None = None
    participant: str | None = None  # the author's display name (else its id)
    author_id: str | None = None  # the author's platform id, as text: what `wake_from` matches
    source_timestamp: str | None = None
    content: list[dict[str, Any]]
    metadata: dict[str, Any] | None = None  # the connector's own claims
    tags: list[str] = []  # after the core closure


class AdmittedPush(msgspec.Struct, frozen=True, kw_only=True):
    """One admitted `push/event`; `channel_id` is None for an unscoped push."""

    event_id: str
    feature_set: str
    source_timestamp: str | None
    content: list[dict[str, Any]]
    origin: dict[str, Any] | None = None  # the connector's own claims
    tags: list[str] = []
    channel_id: str | None = None
    label: str | None = None
    thread_id: str | None = None
    message_id: str | None = None
    reply_to: str | None = None
    named_channel: str | None = None  # `origin.mcplChannelId` as claimed (a string), registered or not
    participant: str | None = None  # `origin.source` when a string: who the stored item says spoke


class PushStored(msgspec.Struct, frozen=True, kw_only=True):
    """What storing one push came to: the answer to send and the item it is."""

    answer: dict[str, Any]  # what to answer (the original answer on a repeat)
    item_id: int  # the stored item's id (the original's on a repeat)
    duplicate: bool  # True: a repeat of an eventId already stored; nothing new stored


class Intake(Protocol):
    async def store_messages(
        self, server_id: str, lane: str, messages: list[AdmittedMessage]
    ) -> list[dict[str, Any]]:
        """Store every message in one commit; per message `{accepted, conversationId}` or a refusal."""

    async def store_push(self, server_id: str, push: AdmittedPush) -> PushStored:
        """Store the push once per (server, eventId); a repeat stores nothing and carries the original's answer and id."""

    def content_problem(self, blocks: list[dict[str, Any]]) -> str | None:
        """Why a push payload cannot be stored ("empty_content", "invalid_content"), or None."""
