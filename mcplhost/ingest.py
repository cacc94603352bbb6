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
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import msgspec

from mcplhost.inbound import canonical_json
from mcplhost.inbound.pipeline import (
    Delivered,
    InFlight,
    Processed,
    Rejected,
    admit,
    run_pipeline,
)
from mcplhost.protocol import errors
from mcplhost.protocol.intake import AdmittedMessage, AdmittedPush
from mcplhost.store import NewItem, Store
from mcplhost.store.writer import GroupWriter

EDITED_TAG = "chat:edited"
#: Recent (connector, channel, messageId) → thread, so a correction usually finds its original's
#: thread without a read.
RECENT_THREADS = 10_000


def now_ms() -> int:
    return int(time.time() * 1000)


def conversation_id(server_id: str, channel_id: str | None, thread_id: str | None) -> str:
    """An opaque, stable id for one conversation: a channel, or a thread in it."""
    key = [server_id, channel_id, thread_id]
    try:
        data = msgspec.json.encode(key)
    except UnicodeEncodeError:  # a lone surrogate in an id
        data = canonical_json(key).encode()
    return "conv_" + hashlib.sha256(data).hexdigest()[:24]


class Ingest:
    def __init__(self, store: Store, writer: GroupWriter, log: Any, *, clock_ms: Callable[[], int] = now_ms,
                 on_stored: Callable[[list[NewItem]], None] | None = None) -> None:
        self.store = store
        self.writer = writer
        self.log = log
        self.clock_ms = clock_ms
        self.on_stored = on_stored  # e.g. `mcplhost dev`'s live view; called after each commit
        self._stripped: set[tuple[str, str]] = set()
        self._threads: OrderedDict[tuple[str, str, str], str | None] = OrderedDict()

    def content_problem(self, blocks: list[dict[str, Any]]) -> str | None:
        probe = Delivered(lane="push/event", kind="unscoped", server_id="", accepted_at=0, blocks=blocks)
        outcome = admit(InFlight(delivered=probe))
        return outcome.reason if isinstance(outcome, Rejected) else None

    async def store_messages(self, server_id: str, lane: str, messages: list[AdmittedMessage]) -> list[dict[str, Any]]:
        accepted_at = self.clock_ms()
        outcomes: list[Processed | Rejected] = []
        rows: list[NewItem] = []
        for m in messages:
            thread_id = m.thread_id
            if thread_id is None and EDITED_TAG in m.tags:
                thread_id = await self._original_thread(server_id, m.channel_id, m.message_id)
            outcome = run_pipeline(Delivered(
                lane=lane, kind="channel", server_id=server_id, accepted_at=accepted_at, blocks=m.content,
                adapter=m.metadata, channel_id=m.channel_id, label=m.label, thread_id=thread_id,
                message_id=m.message_id, reply_to=m.reply_to, source_timestamp=m.source_timestamp,
                tags=list(m.tags), participant=m.participant))
            outcomes.append(outcome)
            if isinstance(outcome, Processed):
                self._remember_thread(server_id, m.channel_id, m.message_id, thread_id)
                rows.append(self._item(server_id, outcome, m.participant, accepted_at))
        if rows:
            await self.writer.store_items(rows)
            self._observe(rows)
        results = []
        conversations: dict[tuple[str | None, str | None], str] = {}  # a batch is mostly one conversation
        for message, outcome in zip(messages, outcomes):
            if isinstance(outcome, Rejected):
                results.append({"messageId": message.message_id, "accepted": False, "reason": outcome.reason,
                                "code": errors.INVALID_PARAMS})
                continue
            source = outcome.metadata["source"]
            place = (source.get("channelId"), source.get("threadId"))
            if place not in conversations:
                conversations[place] = conversation_id(server_id, *place)
            results.append({"messageId": message.message_id, "accepted": True,
                            "conversationId": conversations[place]})
        return results

    async def store_push(self, server_id: str, push: AdmittedPush) -> dict[str, Any]:
        accepted_at = self.clock_ms()
        processed = run_pipeline(Delivered(
            lane="push/event", kind="channel" if push.channel_id else "unscoped", server_id=server_id,
            accepted_at=accepted_at, blocks=push.content, adapter=push.origin, channel_id=push.channel_id,
            label=push.label, thread_id=push.thread_id, message_id=push.message_id, event_id=push.event_id,
            reply_to=push.reply_to, source_timestamp=push.source_timestamp, tags=list(push.tags)))
        if isinstance(processed, Rejected):
            raise errors.invalid_params(f"push payload refused: {processed.reason}", {"reason": processed.reason})
        source = push.origin.get("source") if push.origin else None
        item = self._item(server_id, processed, source if isinstance(source, str) else None, accepted_at)
        answer, stored = await self.writer.store_push(server_id, push.event_id, item, {"accepted": True}, accepted_at)
        if stored:
            self._observe([item])
        return answer

    async def store_surface(self, surface: str, participant: str, text: str) -> None:
        """Store local console input: a `surface` item, marked like any sender's text, with no header."""
        accepted_at = self.clock_ms()
        processed = run_pipeline(Delivered(
            lane="surface", kind="surface", server_id=surface, accepted_at=accepted_at,
            blocks=[{"type": "text", "text": text}], participant=participant))
        if isinstance(processed, Rejected):
            raise ValueError(f"console input refused: {processed.reason}")
        item = self._item(surface, processed, participant, accepted_at)
        await self.writer.store_items([item])
        self._observe([item])

    async def _original_thread(self, server_id: str, channel_id: str, message_id: str) -> str | None:
        """The thread of the message a correction corrects (PROVENANCE §2), recent ones from memory."""
        remembered = self._threads.get((server_id, channel_id, message_id))
        if remembered is not None:
            return remembered
        return await self.store.items.thread_of(server_id, channel_id, message_id)

    def _remember_thread(self, server_id: str, channel_id: str, message_id: str, thread_id: str | None) -> None:
        key = (server_id, channel_id, message_id)
        if thread_id is None:
            # Only threads are worth remembering; a miss costs one read, and only for a correction.
            self._threads.pop(key, None)
            return
        self._threads[key] = thread_id
        self._threads.move_to_end(key)
        if len(self._threads) > RECENT_THREADS:
            self._threads.popitem(last=False)

    def _item(self, server_id: str, processed: Processed, participant: str | None, created_at: int) -> NewItem:
        for key in processed.stripped_keys:
            if (server_id, key) not in self._stripped:
                # Once per (connector, key) per process; the key, never its value.
                self._stripped.add((server_id, key))
                self.log.warning("inbound.host_key_stripped", connector=server_id, key=key)
        return NewItem(role="user", content=processed.content, metadata=processed.metadata,
                       created_at=created_at, participant=participant)

    def _observe(self, items: list[NewItem]) -> None:
        if self.on_stored is not None and items:
            self.on_stored(items)
