"""An agent's own rows as `NewItem`s, each built from its Struct (store/rows.py); notices for agents and speech alike.

    row = own_row("scout", "assistant", text_content("hi"), SpeechMeta(turn_id=7, destination=room), created_at=now)
    notice = notice_row("scout", DraftsNotice(turn_id=7), "Not sent: …", created_at=now)

An agent's own row belongs to it (`agent`, and `participant` the agent) and says what it is only in
host-written metadata (docs/agents.md#compilation). A row that belongs to a conversation (context_scope
"conversation") carries its id twice: the column the store reads contexts by, and `conversationId`.
"""

from __future__ import annotations

from typing import Any

from msgspec.structs import replace

from mcplhost.inbound.notice import SOURCE_RULE_TEXT
from mcplhost.store.items import NewItem
from mcplhost.store.rows import HostRow, NoticeRow, SourceHeaderNotice, row_metadata

__all__ = ["notice_row", "own_row", "source_notice_row", "text_content"]


def text_content(text: str) -> list[dict[str, Any]]:
    """One text block."""
    return [{"type": "text", "text": text}]


def own_row(agent: str, role: str, content: list[dict[str, Any]], meta: HostRow, *, created_at: int,
            conversation_id: str | None = None, thread_id: str | None = None) -> NewItem:
    """The agent's row: `meta` as its metadata, with `conversationId` when it belongs to a conversation."""
    if conversation_id is not None:
        meta = replace(meta, conversation_id=conversation_id)
    return NewItem(role=role, content=content, metadata=row_metadata(meta), created_at=created_at, agent=agent,
                   participant=agent, thread_id=thread_id, conversation_id=conversation_id)


def notice_row(agent: str, notice: NoticeRow, text: str, *, created_at: int, conversation_id: str | None = None,
               ) -> NewItem:
    """A host notice for the agent (`user`, `system: true`); the text is stored as given."""
    return own_row(agent, "user", text_content(text), replace(notice, system=True), created_at=created_at,
                   conversation_id=conversation_id)


def source_notice_row(agent: str, *, created_at: int, conversation_id: str | None = None) -> NewItem:
    """The one-time source-header notice (docs/provenance.md §8): the rule's text.

    Under `context_scope = "conversation"` give the turn's conversation: the
    store reads that scope's context by conversation id, so each
    conversation's context is told once.
    """
    return notice_row(agent, SourceHeaderNotice(), SOURCE_RULE_TEXT, created_at=created_at,
                      conversation_id=conversation_id)
