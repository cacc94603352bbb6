"""An agent's own rows: built as `NewItem`s, and read back for its context.

The rule (docs/agents.md#compilation, Rows): a row says what it is only in
host-written metadata (`kind`, `system`, `turnId`, `tool`, `toolCallId`, ...),
never in its text, and `agent` is the agent the row belongs to. Builders and
readers live side by side so the two cannot drift apart.

Beyond the table, and additive: a tool-call row keeps the call's
`arguments` (the context must replay the call exactly), a tool result says
`isError`, and any row may carry `conversationId` (under
`context_scope = "conversation"` a turn sees only its own conversation's
rows). A speech row with a destination gets that conversation's id itself.
"""

from __future__ import annotations

from typing import Any, Literal

from mcplhost.agents.model import ToolCall
from mcplhost.inbound.conversation import conversation_id as conversation_of_channel
from mcplhost.inbound.notice import SOURCE_HEADER_NOTICE_KIND, build_source_notice
from mcplhost.speech.routing import Destination  # re-exported: speech owns it, agents import speech
from mcplhost.store.items import NewItem, StoredItem

__all__ = [
    "NOTICE_KINDS",
    "Destination",
    "RowKind",
    "draft_row",
    "notice_row",
    "row_conversation",
    "row_kind",
    "source_notice_row",
    "speech_row",
    "tool_call_of",
    "tool_call_row",
    "tool_result_call_id",
    "tool_result_row",
    "turn_of",
]

#: Notice kinds the host writes (docs/agents.md#turns); `notice_row` refuses any other.
NOTICE_KINDS = frozenset({SOURCE_HEADER_NOTICE_KIND, "drafts", "failed-reply", "turn-failed"})

RowKind = Literal["speech", "draft", "tool-call", "tool-result", "notice", "peer", "other"]


def _text(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


def _row(agent: str, role: str, content: list[dict[str, Any]], metadata: dict[str, Any], created_at: int,
         conversation_id: str | None, thread_id: str | None = None) -> NewItem:
    if conversation_id is not None:
        metadata["conversationId"] = conversation_id
    return NewItem(role=role, content=content, metadata=metadata, created_at=created_at, agent=agent,
                   participant=agent, thread_id=thread_id, conversation_id=conversation_id)


# --------------------------------------------------------------------------- builders


def speech_row(agent: str, turn_id: int | None, text: str, destination: Destination | None = None,
               outbox_id: int | None = None, *, created_at: int, conversation_id: str | None = None) -> NewItem:
    """What the agent said: `assistant`, `kind: "speech"`; no destination until the speech router decides one."""
    if destination is not None and conversation_id is None:
        conversation_id = destination.conversation_id()
    metadata = {"kind": "speech", "turnId": turn_id,
                "destination": destination.as_metadata() if destination is not None else None,
                "outboxId": outbox_id}
    return _row(agent, "assistant", _text(text), metadata, created_at, conversation_id,
                destination.thread_id if destination is not None else None)


def draft_row(agent: str, turn_id: int | None, text: str, reason: str, *, created_at: int,
              conversation_id: str | None = None) -> NewItem:
    """Prose that was not sent (docs/agents.md#routing): `assistant`, `kind: "draft"`, with the reason."""
    metadata = {"kind": "draft", "turnId": turn_id, "reason": reason}
    return _row(agent, "assistant", _text(text), metadata, created_at, conversation_id)


def tool_call_row(agent: str, turn_id: int | None, call: ToolCall, text_before: str = "", *, created_at: int,
                  conversation_id: str | None = None) -> NewItem:
    """One tool call the model made: `assistant`, `kind: "tool-call"`; its content is the prose written before it.

    A round with several calls is several rows; give the round's prose to
    the first only (or store it as a speech row just before: the context
    joins the two into one assistant message either way).
    """
    metadata = {"kind": "tool-call", "turnId": turn_id, "tool": call.name, "toolCallId": call.id,
                "arguments": call.arguments}
    return _row(agent, "assistant", _text(text_before) if text_before else [], metadata, created_at,
                conversation_id)


def tool_result_row(agent: str, turn_id: int | None, call_id: str, tool: str, blocks: list[dict[str, Any]],
                    is_error: bool, *, created_at: int, conversation_id: str | None = None) -> NewItem:
    """What a tool answered: `tool`, `kind: "tool-result"`; `blocks` must already be marked (docs/provenance.md §4)."""
    metadata = {"kind": "tool-result", "turnId": turn_id, "tool": tool, "toolCallId": call_id,
                "isError": is_error}
    return _row(agent, "tool", [dict(block) for block in blocks], metadata, created_at, conversation_id)


def notice_row(agent: str, kind: str, text: str, *, created_at: int, conversation_id: str | None = None,
               **extra: Any) -> NewItem:
    """A host notice for the agent: `user`, `system: true`, `kind` one of NOTICE_KINDS; `extra` joins the metadata.

    The text is stored as given; the context shows it after "[host] ".
    """
    if kind not in NOTICE_KINDS:
        raise ValueError(f"not a notice kind: {kind!r}")
    metadata = {**extra, "kind": kind, "system": True}
    return _row(agent, "user", _text(text), metadata, created_at, conversation_id)


def source_notice_row(agent: str, *, created_at: int, conversation_id: str | None = None) -> NewItem:
    """The one-time source-header notice (docs/provenance.md §8).

    Under `context_scope = "conversation"` give the turn's conversation: the
    store reads that scope's context by conversation id, so each
    conversation's context is told once.
    """
    content, metadata = build_source_notice()
    return _row(agent, "user", content, metadata, created_at, conversation_id)


# --------------------------------------------------------------------------- readers


def row_kind(item: StoredItem) -> RowKind:
    """What an agent's own row is, from host metadata only (never from `metadata.adapter` or the text)."""
    metadata = item.metadata
    kind = metadata.get("kind")
    if item.role == "user" and metadata.get("system") is True and kind in NOTICE_KINDS:
        return "notice"
    if item.role == "user" and isinstance(metadata.get("peer"), dict):
        return "peer"
    if item.role == "assistant" and kind in ("speech", "draft"):
        return kind
    if item.role == "assistant" and kind == "tool-call" and tool_call_of(item) is not None:
        return "tool-call"
    if item.role == "tool" and kind == "tool-result" and tool_result_call_id(item) is not None:
        return "tool-result"
    return "other"


def tool_call_of(item: StoredItem) -> ToolCall | None:
    """The call a tool-call row recorded, or None when the row is not one (or is malformed)."""
    metadata = item.metadata
    call_id, tool, arguments = metadata.get("toolCallId"), metadata.get("tool"), metadata.get("arguments", {})
    if metadata.get("kind") != "tool-call" or not isinstance(call_id, str) or not isinstance(tool, str):
        return None
    return ToolCall(id=call_id, name=tool, arguments=arguments if isinstance(arguments, dict) else {})


def tool_result_call_id(item: StoredItem) -> str | None:
    """The call a tool-result row answers, or None."""
    call_id = item.metadata.get("toolCallId")
    return call_id if item.metadata.get("kind") == "tool-result" and isinstance(call_id, str) else None


def turn_of(item: StoredItem) -> int | None:
    """The turn that wrote an agent row (None for rows written outside a turn)."""
    turn = item.metadata.get("turnId")
    return turn if isinstance(turn, int) and not isinstance(turn, bool) else None


def row_conversation(item: StoredItem) -> str | None:
    """The conversation a row belongs to: an agent row's `conversationId`, else its channel and thread."""
    metadata = item.metadata
    if item.agent is not None:
        conversation = metadata.get("conversationId")
        return conversation if isinstance(conversation, str) else None
    server, channel, thread = metadata.get("serverId"), metadata.get("channelId"), metadata.get("threadId")
    if not isinstance(server, str) or not isinstance(channel, str):
        return None  # an unscoped push or a surface item: no conversation
    return conversation_of_channel(server, channel, thread if isinstance(thread, str) else None)
