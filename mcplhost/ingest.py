"""The host's side of the protocol's `Intake` port: admitted items become stored rows.

Each admitted message or push runs through the inbound pipeline (strip →
freeze-source → header → mark, with digests), then is committed through the
group writer; the connector's answer is built only after that commit. A
push is stored once per (connector, eventId): a repeat gets the original
answer and stores nothing.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import msgspec

from mcplhost.inbound import canonical_json
from mcplhost.inbound.pipeline import Delivered, InFlight, Processed, Rejected, admit, run_pipeline
from mcplhost.protocol import errors
from mcplhost.protocol.intake import AdmittedMessage, AdmittedPush
from mcplhost.store import NewItem, Store
from mcplhost.store.writer import GroupWriter

EDITED_TAG = "chat:edited"
_encode = msgspec.json.encode


def now_ms() -> int:
    return int(time.time() * 1000)


def conversation_id(server_id: str, channel_id: str | None, thread_id: str | None) -> str:
    """An opaque, stable id for one conversation: a channel, or a thread in it."""
    digest = hashlib.sha256(canonical_json([server_id, channel_id, thread_id]).encode()).hexdigest()
    return "conv_" + digest[:24]


class Ingest:
    def __init__(self, writer: GroupWriter, log: Any, *, clock_ms: Callable[[], int] = now_ms,
                 on_stored: Callable[[list[NewItem]], None] | None = None) -> None:
        self.writer = writer
        self.on_stored = on_stored  # e.g. `mcplhost dev`'s live view; called after each commit
        self.log = log
        self.clock_ms = clock_ms
        self._stripped: set[tuple[str, str]] = set()

    def content_problem(self, blocks: list[dict[str, Any]]) -> str | None:
        probe = Delivered(lane="push/event", kind="unscoped", server_id="", accepted_at=0, blocks=blocks)
        outcome = admit(InFlight(delivered=probe))
        return outcome.reason if isinstance(outcome, Rejected) else None

    def _note_stripped(self, server_id: str, processed: Processed) -> None:
        """Log once per (connector, key) per process; name the key, never its value."""
        for key in processed.stripped_keys:
            if (server_id, key) not in self._stripped:
                self._stripped.add((server_id, key))
                self.log.warning("inbound.host_key_stripped", connector=server_id, key=key)

    def _item(self, server_id: str, processed: Processed, participant: str | None, created_at: int) -> NewItem:
        self._note_stripped(server_id, processed)
        return NewItem(role="user", content=processed.content, metadata=processed.metadata,
                       created_at=created_at, participant=participant)

    async def store_messages(self, server_id: str, lane: str, messages: list[AdmittedMessage]) -> list[dict[str, Any]]:
        accepted_at = self.clock_ms()
        deliveries = [
            Delivered(lane=lane, kind="channel", server_id=server_id, accepted_at=accepted_at, blocks=m.content,
                      adapter=m.metadata, channel_id=m.channel_id, label=m.label, thread_id=m.thread_id,
                      message_id=m.message_id, reply_to=m.reply_to, source_timestamp=m.source_timestamp,
                      tags=list(m.tags), participant=m.participant)
            for m in messages
        ]

        async def write(store: Store) -> list[Processed | Rejected]:
            outcomes: list[Processed | Rejected] = []
            for delivered in deliveries:
                if delivered.thread_id is None and EDITED_TAG in delivered.tags and delivered.message_id:
                    # A correction that names no thread keeps its original's (PROVENANCE §2).
                    inherited = await store.items.thread_of(server_id, delivered.channel_id or "", delivered.message_id)
                    if inherited is not None:
                        delivered = msgspec.structs.replace(delivered, thread_id=inherited)
                outcomes.append(run_pipeline(delivered))
            rows = [self._item(server_id, o, d.participant, accepted_at)
                    for o, d in zip(outcomes, deliveries) if isinstance(o, Processed)]
            await store.items.insert_many_nocommit(rows)
            stored.extend(rows)
            return outcomes

        stored: list[NewItem] = []
        outcomes = await self.writer.submit(write)
        self._observe(stored)
        results = []
        for message, outcome in zip(messages, outcomes):
            if isinstance(outcome, Rejected):
                results.append({"messageId": message.message_id, "accepted": False, "reason": outcome.reason,
                                "code": errors.INVALID_PARAMS})
            else:
                source = outcome.metadata["source"]
                results.append({"messageId": message.message_id, "accepted": True,
                                "conversationId": conversation_id(server_id, source.get("channelId"),
                                                                  source.get("threadId"))})
        return results

    async def store_push(self, server_id: str, push: AdmittedPush) -> dict[str, Any]:
        accepted_at = self.clock_ms()
        delivered = Delivered(
            lane="push/event", kind="channel" if push.channel_id else "unscoped", server_id=server_id,
            accepted_at=accepted_at, blocks=push.content, adapter=push.origin, channel_id=push.channel_id,
            label=push.label, thread_id=push.thread_id, message_id=push.message_id, event_id=push.event_id,
            reply_to=push.reply_to, source_timestamp=push.source_timestamp, tags=list(push.tags),
        )
        processed = run_pipeline(delivered)
        if isinstance(processed, Rejected):
            raise errors.invalid_params(f"push payload refused: {processed.reason}", {"reason": processed.reason})
        participant = push.origin.get("source") if push.origin and isinstance(push.origin.get("source"), str) else None

        item = self._item(server_id, processed, participant, accepted_at)

        async def write(store: Store) -> tuple[dict[str, Any], bool]:
            earlier = await store.pushes.get(server_id, push.event_id)
            if earlier is not None:
                return msgspec.json.decode(earlier), False  # a repeat: the original answer, nothing stored
            answer: dict[str, Any] = {"accepted": True}
            await store.items.insert_many_nocommit([item])
            await store.pushes.record_nocommit(server_id, push.event_id, _encode(answer), accepted_at)
            return answer, True

        answer, stored = await self.writer.submit(write)
        if stored:
            self._observe([item])
        return answer

    def _observe(self, items: list[NewItem]) -> None:
        if self.on_stored is not None and items:
            self.on_stored(items)
