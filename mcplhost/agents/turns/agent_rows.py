"""An agent's own rows: built as `NewItem`s from their Structs (store/rows.py), and read back for its context.

The rule (docs/agents.md#compilation, Rows): a row says what it is only in
host-written metadata (`kind`, `system`, `turnId`, `tool`, `toolCallId`, ...),
never in its text, and `agent` is the agent the row belongs to. The shapes
are store/rows.py's Structs, so builders and readers cannot drift apart;
the notices, which speech writes too, are built in store/own_rows.py.

Beyond the table, and additive: a tool-call row keeps the call's
`arguments` (the context must replay the call exactly), a tool result says
`isError`, and any row may carry `conversationId` (under
`context_scope = "conversation"` a turn sees only its own conversation's
rows). A speech row with a destination gets that conversation's id itself.
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET

from mcplhost.agents.model import ToolCall
from mcplhost.inbound.conversation import conversation_id as conversation_of_channel
from mcplhost.store.items import NewItem, StoredItem
from mcplhost.store.own_rows import own_row, text_content
from mcplhost.store.rows import (
    Destination,
    DraftMeta,
    DraftsNotice,
    FailedReplyNotice,
    Notice,
    PeerMeta,
    SpeechMeta,
    ToolCallMeta,
    ToolResultMeta,
)

__all__ = [
    "RowKind",
    "draft_row",
    "row_conversation",
    "row_kind",
    "speech_row",
    "tool_call_of",
    "tool_call_row",
    "tool_result_call_id",
    "tool_result_row",
    "turn_of",
]

RowKind = Literal["speech", "draft", "tool-call", "tool-result", "notice", "peer", "other"]


# --------------------------------------------------------------------------- builders


def speech_row(agent: str, turn_id: int | None, text: str, destination: Destination | None = None,
               outbox_id: int | None = None, *, created_at: int, conversation_id: str | None = None,
               failure_reply: bool = False) -> NewItem:
    """What the agent said: `assistant`, `kind: "speech"`; no destination until the speech router decides one.

    `failure_reply`: the row is a failed turn's reply (docs/agents.md#failure-reply).
    """
    if destination is not None and conversation_id is None:
        conversation_id = destination.conversation_id()
    meta = SpeechMeta(turn_id=turn_id, destination=destination, outbox_id=outbox_id,
                      failure_reply=True if failure_reply else UNSET)
    return own_row(agent, "assistant", text_content(text), meta, created_at=created_at,
                   conversation_id=conversation_id, thread_id=destination.thread_id if destination else None)


def draft_row(agent: str, turn_id: int | None, text: str, reason: str, *, created_at: int,
              conversation_id: str | None = None) -> NewItem:
    """Prose that was not sent (docs/agents.md#routing): `assistant`, `kind: "draft"`, with the reason."""
    return own_row(agent, "assistant", text_content(text), DraftMeta(turn_id=turn_id, reason=reason),
                   created_at=created_at, conversation_id=conversation_id)


def tool_call_row(agent: str, turn_id: int | None, call: ToolCall, text_before: str = "", *, created_at: int,
                  conversation_id: str | None = None) -> NewItem:
    """One tool call the model made: `assistant`, `kind: "tool-call"`; its content is the prose written before it.

    A round with several calls is several rows; give the round's prose to
    the first only (or store it as a speech row just before: the context
    joins the two into one assistant message either way).
    """
    meta = ToolCallMeta(turn_id=turn_id, tool=call.name, tool_call_id=call.id, arguments=call.arguments)
    return own_row(agent, "assistant", text_content(text_before) if text_before else [], meta,
                   created_at=created_at, conversation_id=conversation_id)


def tool_result_row(agent: str, turn_id: int | None, call_id: str, tool: str, blocks: list[dict[str, Any]],
                    is_error: bool, *, created_at: int, conversation_id: str | None = None) -> NewItem:
    """What a tool answered: `tool`, `kind: "tool-result"`; `blocks` must already be marked (docs/provenance.md §4)."""
    meta = ToolResultMeta(turn_id=turn_id, tool=tool, tool_call_id=call_id, is_error=is_error)
    return own_row(agent, "tool", [dict(block) for block in blocks], meta, created_at=created_at,
                   conversation_id=conversation_id)


# --------------------------------------------------------------------------- readers


def row_kind(item: StoredItem) -> RowKind:
    """What an agent's own row is, from host metadata only (never from `metadata.adapter` or the text)."""
    match item.host, item.role:
        case Notice(system=True), "user":
            return "notice"
        case PeerMeta(), "user":
            return "peer"
        case SpeechMeta(), "assistant":
            return "speech"
        case DraftMeta(), "assistant":
            return "draft"
        case ToolCallMeta(), "assistant":
            return "tool-call"
        case ToolResultMeta(), "tool":
            return "tool-result"
    return "other"


def tool_call_of(item: StoredItem) -> ToolCall | None:
    """The call a tool-call row recorded, or None when the row is not one (or is malformed)."""
    host = item.host
    if not isinstance(host, ToolCallMeta):
        return None
    return ToolCall(id=host.tool_call_id, name=host.tool, arguments=host.arguments)


def tool_result_call_id(item: StoredItem) -> str | None:
    """The call a tool-result row answers, or None."""
    host = item.host
    return host.tool_call_id if isinstance(host, ToolResultMeta) else None


def turn_of(item: StoredItem) -> int | None:
    """The turn that wrote an agent row, or that a peer row was delivered into (None for rows outside a turn)."""
    match item.host:
        case SpeechMeta(turn_id=turn) | DraftMeta(turn_id=turn) | ToolCallMeta(turn_id=turn) | \
             ToolResultMeta(turn_id=turn) | DraftsNotice(turn_id=turn) | FailedReplyNotice(turn_id=turn):
            return turn
        case PeerMeta(turn_id=int() as turn):
            return turn
    return None


def row_conversation(item: StoredItem) -> str | None:
    """The conversation a row belongs to: an agent row's `conversationId`, else its channel and thread."""
    meta = item.meta
    if item.agent is not None:
        return meta.conversation_id
    if meta.server_id is None or meta.channel_id is None:
        return None  # an unscoped push or a surface item: no conversation
    return conversation_of_channel(meta.server_id, meta.channel_id, meta.thread_id)
