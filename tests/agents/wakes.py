"""Stored events for the wake and scheduler tests, built through the real inbound pipeline.

    event(7, tags=["chat:addressed"], author_id="u1")   # a channel message on disc's room
    event(8, lane="push/event", channel=None)            # an unscoped push
    event(9, surface=True, agent="scout")                # console input typed to scout
"""

from __future__ import annotations

from typing import Any

from mcplhost.inbound.conversation import conversation_id
from mcplhost.inbound.pipeline import Delivered, Processed, run_pipeline
from mcplhost.ingest import Stored
from mcplhost.store import NewItem

ROOM = "disc:g1:room"
ACCEPTED_AT = 1_790_000_000_000


def event(item_id: int, body: str = "hello", *, server: str = "disc", channel: str | None = ROOM,
          thread: str | None = None, tags: list[str] | None = None, lane: str = "channels/incoming",
          author_id: str | None = None, participant: str | None = "Alice", agent: str | None = None,
          surface: bool = False, echo_of: Any = None) -> Stored:
    """One `Stored` event as ingest would emit it (metadata from the real pipeline)."""
    if surface:
        delivered = Delivered(lane="surface", kind="surface", server_id="console", accepted_at=ACCEPTED_AT,
                              blocks=[{"type": "text", "text": body}], participant=participant)
    else:
        delivered = Delivered(lane=lane, kind="channel" if channel else "unscoped", server_id=server,
                              accepted_at=ACCEPTED_AT, blocks=[{"type": "text", "text": body}], channel_id=channel,
                              label="#room", thread_id=thread, message_id=f"m-{item_id}",
                              event_id=f"e-{item_id}" if lane == "push/event" else None,
                              tags=list(tags or []), participant=participant, author_id=author_id)
    processed = run_pipeline(delivered)
    assert isinstance(processed, Processed)
    metadata = dict(processed.metadata)
    if echo_of is not None:
        metadata["echoOf"] = echo_of
    conversation = conversation_id(server, channel, thread) if channel and not surface else None
    item = NewItem(role="user", content=processed.content, metadata=metadata, created_at=ACCEPTED_AT,
                   agent=agent, participant=participant, thread_id=thread, conversation_id=conversation)
    return Stored(item_id, item)
