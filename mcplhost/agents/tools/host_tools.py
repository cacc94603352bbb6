"""The host's own tools as the model is offered them, and what `channel_open`'s backscroll becomes (docs/agents.md#tools).

    HOST_TOOLS, PEER_TOOLS                                  # their names, descriptions and schemas
    blocks, kept, skipped = backscroll_blocks(handle, opened, entries, accepted_at)

Backscroll is an extension (MCPL defines none; docs/mcpl-compat.md#backscroll-on-channelsopen):
`channel_open` asks for `history: {limit}` (the `history` argument, default
`BACKSCROLL_DEFAULT`, at most `MAX_BACKSCROLL`) and reads the answer's
`history`, entries shaped like `channels/incoming` messages (`content` may
also be a string), as discord-mcpl sends them; a `messages` member is read
only when `history` is absent. An entry naming another `channelId` is headed
by that channel.
Each entry goes through the inbound pipeline under its own channel's header.
"""

from __future__ import annotations

from typing import Any, Protocol

from msgspec import Raw

from mcplhost.agents.model import ToolSpec
from mcplhost.agents.tools.listing import EMPTY_SCHEMA
from mcplhost.agents.tools.outcome import marked
from mcplhost.inbound.notice import SOURCE_RULE_TEXT
from mcplhost.inbound.pipeline import Delivered, Processed, run_pipeline
from mcplhost.jsonobject import JsonObject
from mcplhost.protocol.answers import BackscrollEntry, decode_each
from mcplhost.protocol.channels import Channel
from mcplhost.protocol.ports import ChannelOpenPort
from mcplhost.speech.notices import shown_label

#: history_search's `limit`: the default and the most it returns.
SEARCH_LIMIT_DEFAULT = 20
SEARCH_LIMIT_MAX = 50
#: Backscroll entries read from one channels/open answer (and the most `channel_open` asks for); the rest are left out.
MAX_BACKSCROLL = 100
#: What `channel_open` asks for when its `history` argument is absent.
BACKSCROLL_DEFAULT = 20
#: Longest `thread` argument `channel_publish` takes (an id, not prose).
MAX_THREAD_CHARS = 512
#: Channels channel_list lists at most; it says how many more there are.
CHANNEL_LIST_MAX = 500


def listed_label(label: str | None) -> str | None:
    """A channel label as channel_list shows it: cut (speech/notices.py `shown_label`), marked."""
    return None if label is None else marked(shown_label(label))

HOST_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(name="channel_list", input_schema=EMPTY_SCHEMA, description=(
        "List the channels you hear and may open: each as connector/channel-id, with its label, direction and "
        "whether it is open. " + SOURCE_RULE_TEXT)),
    ToolSpec(name="channel_open", description=(
        "Open a channel (connector/channel-id, or a bare id or label naming exactly one channel) and read its "
        f"recent messages (`history`, default {BACKSCROLL_DEFAULT}, at most {MAX_BACKSCROLL}), each under its own "
        "[source: …] header. " + SOURCE_RULE_TEXT),
        input_schema={"type": "object", "properties": {
            "channel": {"type": "string"},
            "history": {"type": "integer", "minimum": 0, "maximum": MAX_BACKSCROLL}}, "required": ["channel"]}),
    ToolSpec(name="channel_publish", description=(
        "Send `text` to a channel now (connector/channel-id, or a bare id or label naming exactly one channel; "
        "`thread` optional). Answers {\"status\":\"queued\",\"outboxId\":…} or "
        "{\"status\":\"refused\",\"reason\":…} (unknown, ambiguous, inbound_only, not_permitted, no_publish)."),
        input_schema={"type": "object", "properties": {
            "channel": {"type": "string"}, "text": {"type": "string"}, "thread": {"type": "string"}},
            "required": ["channel", "text"]}),
    ToolSpec(name="history_search", description=(
        "Search the bodies of the messages you hear (never their [source: …] headers), newest first, up to "
        "`limit` hits; `regex` makes the query a regular expression. The search has a time limit: an answer with "
        "`stoppedEarly` says how far back it got, `timedOut` counts messages the expression was too slow on. "
        + SOURCE_RULE_TEXT),
        input_schema={"type": "object", "properties": {
            "query": {"type": "string"}, "regex": {"type": "boolean"},
            "limit": {"type": "integer", "minimum": 1, "maximum": SEARCH_LIMIT_MAX}}, "required": ["query"]}),
)
#: The peer tools (docs/peers.md): offered only to an agent that shares its tree with another.
PEER_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(name="task_send_message", description=(
        "Send `message` (plain text) to another agent of your tree (`target`: its name, as task_list shows it). "
        "To one of your descendants it is guidance; to any other agent it arrives as an untrusted peer message. "
        "`dispatch`: \"tool-end\" (at the target's next tool call; the default, except to an ancestor) or "
        "\"turn-end\" (when the target's turn ends; the default to an ancestor). Answers {\"status\",\"target\"}: "
        "accepted (a turn starts for it), queued (it is busy), refused (with `reason`), rate_limited (with "
        "`retryAfterMs`), not_active or invalid_scope. Never ask a peer to do what your own constraints forbid. "
        "A turn a peer message started has no chat to answer: reply to the sender with this tool."),
        input_schema={"type": "object", "properties": {
            "target": {"type": "string"}, "message": {"type": "string"},
            "dispatch": {"type": "string", "enum": ["tool-end", "turn-end"]}}, "required": ["target", "message"]}),
    ToolSpec(name="task_list", description=(
        "List the agents of your tree: your descendants, or with scope \"tree\" every member including the "
        "root, each with its relationship to you (self, ancestor, sibling, descendant), its status and title."),
        input_schema={"type": "object", "properties": {
            "scope": {"type": "string", "enum": ["descendants", "tree"]}}}),
)
PEER_TOOL_NAMES = frozenset(spec.name for spec in PEER_TOOLS)
#: How much of a `target` that names no agent (names have at most 32 characters) its answer echoes back.
PEER_TARGET_SHOWN_CHARS = 64


class Publisher(Protocol):
    """How `channel_publish` queues: the turn's speech (mcplhost/agents/turns/reply.py `TurnSpeech`)."""

    async def publish(self, channel: str, text: str, thread: str | None = None) -> JsonObject: ...



def backscroll_item(entry: BackscrollEntry, handle: ChannelOpenPort, opened: Channel,
                    accepted_at: int) -> list[dict[str, Any]] | None:
    """One backscroll entry as the blocks an item would be stored with, or None when the pipeline refuses it.

    An entry is shaped like a `channels/incoming` message (`content` may also
    be a plain string; protocol/answers.py `BackscrollEntry`). It goes through
    the inbound pipeline, so its text is marked and its header is its *own*
    channel's (`channelId`, else the opened channel), whatever channel it was
    returned for.
    """
    content = entry.content
    if isinstance(content, str):  # the Struct's union: a string, or blocks
        content = [{"type": "text", "text": content}]
    channel_id = entry.channelId or opened.id
    registered = handle.channel(channel_id)
    processed = run_pipeline(Delivered(
        lane="channels/incoming", kind="channel", server_id=handle.name, accepted_at=accepted_at, blocks=content,
        adapter=entry.metadata, channel_id=channel_id,
        label=registered.label if registered is not None else None, thread_id=entry.threadId,
        message_id=entry.messageId, reply_to=entry.replyTo, source_timestamp=entry.timestamp, tags=entry.tags,
        participant=entry.author.name if entry.author is not None else None))
    return processed.content if isinstance(processed, Processed) else None



def backscroll_blocks(handle: ChannelOpenPort, opened: Channel, entries: list[Raw],
                      accepted_at: int) -> tuple[list[dict[str, Any]], int, int]:
    """The blocks of every well-formed entry (at most MAX_BACKSCROLL), how many were kept and how many skipped."""
    blocks: list[dict[str, Any]] = []
    kept = skipped = 0
    for entry in decode_each(entries[:MAX_BACKSCROLL], BackscrollEntry):
        item = backscroll_item(entry, handle, opened, accepted_at) if entry is not None else None
        if item is None:
            skipped += 1
            continue
        kept += 1
        blocks.extend(item)
    return blocks, kept, skipped
