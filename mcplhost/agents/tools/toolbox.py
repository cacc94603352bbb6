"""The tools one agent is offered, and calling them (docs/agents.md#tools).

Host tools: `channel_list`, `channel_open`, `channel_publish` (queued
through the turn's `TurnSpeech`, mcplhost/agents/turns/reply.py) and
`history_search`; to an agent that shares its tree with another, the peer
tools `task_send_message` and `task_list` (mcplhost/peers/service.py). Connector tools: every
MCP tool of a connector the agent hears that holds `tools` now (an MCP-only
connector too), offered as `<connector>__<tool>`. The agent's `tools` globs
narrow both. What a tool returns is marked like an item body
(docs/provenance.md §4) before the model sees it; `channel_open`'s backscroll
items go through the inbound pipeline, each under its own channel's source
header.

A connector's tool listing is untrusted text too (docs/connectors.md §13):
every string of a tool's description and `inputSchema` (keys included) is
marked like a body; a description is cut at TOOL_DESCRIPTION_MAX_CHARS; a
tool whose schema encodes longer than TOOL_SCHEMA_MAX_BYTES, or nests deeper
than TOOL_SCHEMA_MAX_DEPTH, is not offered (one log line per tool); and the
connector tools together take at most 1/TOOLS_MAX_DIVISOR of the agent's
`context_chars` (the rest are not offered, logged once each). A tool not
offered cannot be called. Names need no marking: `TOOL_NAME` admits no `[`.
Channel descriptors reach the model through `channel_list` and
`channel_open`: ids and labels marked, a label cut (speech/notices.py `shown_label`),
at most CHANNEL_LIST_MAX channels listed. Ids need no cut: a registered
descriptor is bounded whole (protocol/channels.py MAX_CHANNEL_TEXT_CHARS).

A tool that fails (an error answer, a timeout, a connector not serving, bad
arguments) is a result the model reads (`ToolOutcome.is_error`), never an
exception: it never fails the turn and never counts against the connector.
A timed-out `tools/call` is followed by MCP `notifications/cancelled`.

Backscroll is an extension (MCPL defines none; docs/mcpl-compat.md#backscroll-on-channelsopen):
`channel_open` asks for `history: {limit}` (the `history` argument, default
`BACKSCROLL_DEFAULT`, at most `MAX_BACKSCROLL`) and reads the answer's
`history`, entries shaped like `channels/incoming` messages (`content` may
also be a string), as discord-mcpl sends them; a `messages` member is read
only when `history` is absent. An entry naming another `channelId` is headed
by that channel. Connector tools
are called under the agent's `tool_timeout_s`, not the
connector's `request_timeout_s`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from fnmatch import fnmatchcase
from typing import Any, Protocol

import anyio
import msgspec
import structlog
from msgspec import UNSET, Raw

from mcplhost.agents.hearing import heard_by, heard_connectors
from mcplhost.agents.model import ToolCall, ToolSpec
from mcplhost.agents.tools.listing import TOOLS_MAX_DIVISOR, tool_chars
from mcplhost.config import AgentConfig
from mcplhost.inbound import mark_openings
from mcplhost.inbound.mark import has_opening
from mcplhost.inbound.notice import SOURCE_RULE_TEXT
from mcplhost.inbound.pipeline import Delivered, Processed, run_pipeline
from mcplhost.ingest import Stored
from mcplhost.peers.service import PeerRefusal, PeerService
from mcplhost.protocol.answers import (
    BackscrollEntry,
    ContentBlock,
    ListedTool,
    MalformedAnswer,
    ToolResult,
    decode_answer,
    decode_each,
)
from mcplhost.protocol.channels import Channel
from mcplhost.protocol.errors import ConnectorProtocolError
from mcplhost.protocol.ports import ChannelOpenPort, ConnectorNotReady, ToolCallPort, ToolPort
from mcplhost.rpc import LineTooLong, RemoteError, RequestTimeout
from mcplhost.secrets import Secrets
from mcplhost.speech.notices import shown_label
from mcplhost.speech.withhold import SECRET
from mcplhost.store import Store
from mcplhost.store.readers import SEARCH_DEADLINE_S, SearchError, search_items
from mcplhost.store.search_query import SearchFilter

log = structlog.get_logger()

#: `<connector>__<tool>`: what every backend accepts as a function name.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SEPARATOR = "__"
#: history_search's `limit`: the default and the most it returns.
SEARCH_LIMIT_DEFAULT = 20
SEARCH_LIMIT_MAX = 50
#: A notifications/cancelled that cannot be queued within this long is given up.
CANCEL_SEND_TIMEOUT_S = 1.0
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
#: Backscroll entries read from one channels/open answer (and the most `channel_open` asks for); the rest are left out.
MAX_BACKSCROLL = 100
#: What `channel_open` asks for when its `history` argument is absent.
BACKSCROLL_DEFAULT = 20
#: Content blocks read from one tools/call result; the rest are left out, and one line says how many.
MAX_RESULT_BLOCKS = 256
#: Longest `thread` argument `channel_publish` takes (an id, not prose).
MAX_THREAD_CHARS = 512
#: Longest connector tool description the model reads; the rest is cut, and the cut said.
TOOL_DESCRIPTION_MAX_CHARS = 4096
#: A connector tool whose `inputSchema` is longer than this as JSON (bytes) is not offered.
TOOL_SCHEMA_MAX_BYTES = 16 * 1024
#: ... nor one whose `inputSchema` nests deeper than this (objects and arrays).
TOOL_SCHEMA_MAX_DEPTH = 32
#: What follows a description cut at TOOL_DESCRIPTION_MAX_CHARS.
DESCRIPTION_CUT_NOTE = f" … (cut by the host at {TOOL_DESCRIPTION_MAX_CHARS} characters)"
#: Channels channel_list lists at most; it says how many more there are.
CHANNEL_LIST_MAX = 500
#: Tools left out whose warning is remembered, so it is logged once per tool.
NOT_OFFERED_REMEMBERED = 4096
#: The method whose answers are read here (protocol/answers.py).
TOOLS_CALL = "tools/call"
#: Longest part of a connector's error text (or an exception naming its ids) a failed call shows.
CONNECTOR_ERROR_MAX_CHARS = 500


class ToolOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What the model reads back: content blocks (already marked) and whether the call failed."""

    blocks: list[dict[str, Any]]
    is_error: bool = False


def cut_error(text: object) -> str:
    """A connector's error text (or an exception holding its words) cut at CONNECTOR_ERROR_MAX_CHARS; marked later."""
    words = str(text)
    return words if len(words) <= CONNECTOR_ERROR_MAX_CHARS else words[:CONNECTOR_ERROR_MAX_CHARS] + "…"


def redacted_outcome(outcome: ToolOutcome, secrets: Secrets) -> ToolOutcome:
    """`outcome` with every secret value in its blocks replaced by `[redacted:NAME]` (docs/agents.md#secrets)."""
    if not secrets or secrets.find_json(outcome.blocks) is None:
        return outcome
    return ToolOutcome(blocks=secrets.redact_json(outcome.blocks), is_error=outcome.is_error)


def failure(text: str) -> ToolOutcome:
    """A failed call, said in one marked line the model reads."""
    return ToolOutcome(blocks=mark_openings([{"type": "text", "text": f"[host] {text}"}]), is_error=True)


def marked(text: str) -> str:
    """`text` with every opening marked (a connector's or sender's words, docs/provenance.md §4)."""
    return str(mark_openings([{"type": "text", "text": text}])[0]["text"])


def as_text(value: Any) -> ToolOutcome:
    """A host tool's JSON answer as one text block; its strings are marked by the caller, before encoding.

    Marking the encoded JSON instead would put a backslash before a `[`,
    which is no JSON escape: the model would read broken JSON.
    """
    return ToolOutcome(blocks=[{"type": "text", "text": json.dumps(value, ensure_ascii=False, sort_keys=True)}])


def schema_problem(schema: Any) -> str | None:
    """Why a connector's `inputSchema` is not offered (too long as JSON, or nested too deep), or None.

    Bounded whatever the schema's size: the walk counts at least one byte
    per value it visits and stops once over TOOL_SCHEMA_MAX_BYTES, so only
    a schema already known to be small is encoded.
    """
    too_long = f"its inputSchema is longer than {TOOL_SCHEMA_MAX_BYTES} bytes as JSON"
    room = TOOL_SCHEMA_MAX_BYTES
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > TOOL_SCHEMA_MAX_DEPTH:
                return f"its inputSchema nests deeper than {TOOL_SCHEMA_MAX_DEPTH} levels"
            room -= 2  # its brackets
            members = value.items() if isinstance(value, dict) else enumerate(value)
            for key, member in members:
                room -= len(key) + 3 if isinstance(key, str) else 1  # a key, its quotes and colon; or a comma
                if room < 0:
                    return too_long  # before a million members are even looked at
                stack.append((member, depth + 1))
        else:
            room -= len(value) + 2 if isinstance(value, str) else 1
        if room < 0:
            return too_long
    try:
        encoded = msgspec.json.encode(schema)
    except (TypeError, ValueError, OverflowError):
        return "its inputSchema is not JSON"
    return too_long if len(encoded) > TOOL_SCHEMA_MAX_BYTES else None


def marked_json(value: Any) -> Any:
    """`value` with every string in it (object keys too) marked like a body; called on bounded schemas only."""
    if isinstance(value, str):
        return marked(value) if has_opening(value) else value
    if isinstance(value, dict):
        return {marked_json(key): marked_json(member) for key, member in value.items()}
    if isinstance(value, list):
        return [marked_json(member) for member in value]
    return value


def connector_tool_spec(connector: str, name: str, tool: ListedTool) -> ToolSpec | str:
    """How a connector's MCP tool is offered as `name`: marked and bounded; or why it is not offered."""
    schema = tool.inputSchema
    if schema is not None:
        problem = schema_problem(schema)
        if problem is not None:
            return problem
        schema = marked_json(schema)
    else:
        schema = EMPTY_SCHEMA
    description = tool.description
    shown = marked(description[:TOOL_DESCRIPTION_MAX_CHARS])
    if len(description) > TOOL_DESCRIPTION_MAX_CHARS:
        shown += DESCRIPTION_CUT_NOTE
    return ToolSpec(name=name, description=f"({connector}) {shown}".strip(), input_schema=schema)


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

    async def publish(self, channel: str, text: str, thread: str | None = None) -> dict[str, Any]: ...


def offered(agent: AgentConfig, name: str) -> bool:
    """Whether the agent's `tools` globs let it have the tool called `name` (no `tools`: every tool)."""
    return agent.tools is None or any(fnmatchcase(name, glob) for glob in agent.tools)


def result_blocks(result: ToolResult | MalformedAnswer) -> tuple[list[dict[str, Any]], bool]:
    """An MCP `tools/call` result as marked blocks the model can read, and its `isError`.

    Text and inline images pass; other blocks become a `[host]` line naming
    them; a result with only `structuredContent` is shown as its JSON.
    """
    if isinstance(result, MalformedAnswer):
        return [{"type": "text", "text": "[host] the tool answered something that is not an MCP result"}], True
    blocks: list[dict[str, Any]] = []
    for block in decode_each(result.content[:MAX_RESULT_BLOCKS], ContentBlock):
        if block is None:
            blocks.append({"type": "text", "text": "[host] a malformed block of the result is left out"})
        elif block.type == "text" and block.text is not None:
            blocks.append({"type": "text", "text": block.text})
        elif block.type == "image" and block.data is not None and block.mimeType is not None:
            blocks.append({"type": "image", "data": block.data, "mimeType": block.mimeType})
        else:
            blocks.append({"type": "text", "text": f"[host] a {block.type} block of the result is left out"})
    if len(result.content) > MAX_RESULT_BLOCKS:
        blocks.append({"type": "text", "text": f"[host] {len(result.content) - MAX_RESULT_BLOCKS} more blocks of the"
                                               f" result are left out (at most {MAX_RESULT_BLOCKS} are read)"})
    if not blocks and result.structuredContent is not UNSET:
        blocks.append({"type": "text", "text": json.dumps(result.structuredContent, ensure_ascii=False)})
    if not blocks:
        blocks.append({"type": "text", "text": "[host] the tool returned no content"})
    return mark_openings(blocks), result.isError


def call_result_blocks(raw: Raw | bytes) -> tuple[list[dict[str, Any]], bool]:
    """`result_blocks` of a `tools/call` answer as it came (protocol/answers.py `ToolResult`); pure."""
    try:
        result: ToolResult | MalformedAnswer = decode_answer(raw, ToolResult, TOOLS_CALL)
    except MalformedAnswer as exc:
        result = exc
    return result_blocks(result)


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


def _judge(connector: str, name: str, tool: ListedTool) -> tuple[ToolSpec | str, int]:
    """One listed tool as offered (its spec and its chars), or why it is not (pure: safe in a worker thread)."""
    verdict = connector_tool_spec(connector, name, tool)
    return verdict, 0 if isinstance(verdict, str) else tool_chars(verdict)


class ToolBox:
    """One agent's tools: `specs()` offers them, `call()` runs one and never raises for a tool's failure."""

    def __init__(self, agent: AgentConfig, handles: Mapping[str, ToolPort], store: Store, *,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 peers: PeerService | None = None, woken: Callable[[Stored], None] | None = None) -> None:
        self.agent = agent
        self.peers = peers  # the host's peer messaging (None: no peer tools)
        #: Where a peer row delivered at once to an idle target goes to wake it (the runtime's; None: nowhere).
        self.woken = woken
        self.handles = handles
        self.store = store
        #: What history_search reads: items everyone may see (no agent's own rows) from what the agent hears.
        self.heard = SearchFilter(heard=tuple(agent.hears or ()))
        self.clock_ms = clock_ms
        self._log = log.bind(agent=agent.name)
        self._unnamable: set[str] = set()  # tools skipped for a name no backend takes, warned once each
        self._not_offered: set[tuple[str, str]] = set()  # (tool, why) of tools left out, warned once each
        # offered name → (the MCP tool as listed, what it is offered as, its chars): judged once per listing
        self._judged: dict[str, tuple[ListedTool, ToolSpec | str, int]] = {}
        self._opened: set[tuple[str, str]] = set()  # channels opened through channel_open in this run

    # --- what is offered -------------------------------------------------------------

    def connector_tools(self) -> dict[str, tuple[ToolCallPort, ListedTool]]:
        """Offered name → (handle, MCP tool), connector order then listing order."""
        tools: dict[str, tuple[ToolCallPort, ListedTool]] = {}
        for handle in heard_connectors(self.handles, self.agent):
            for tool in handle.tools():
                name = f"{handle.name}{SEPARATOR}{tool.name}"
                if not TOOL_NAME.match(name):
                    if name not in self._unnamable:
                        self._unnamable.add(name)
                        self._log.warning("agent.tool_unnamable", connector=handle.name, tool=tool.name,
                                          detail="not [A-Za-z0-9_-]{1,64} as <connector>__<tool>: not offered")
                    continue
                if offered(self.agent, name) and name not in tools:
                    tools[name] = (handle, tool)
        return tools

    def offered_connector_tools(self) -> dict[str, tuple[ToolCallPort, ListedTool, ToolSpec]]:
        """Offered name → (handle, MCP tool, spec) of the connector tools offered now: marked, bounded, in budget.

        In listing order, each tool that still fits the budget is offered (a long one left out leaves room).
        """
        budget = self.agent.context_chars // TOOLS_MAX_DIVISOR
        offered_now: dict[str, tuple[ToolCallPort, ListedTool, ToolSpec]] = {}
        judged: dict[str, tuple[ListedTool, ToolSpec | str, int]] = {}
        for name, (handle, tool) in self.connector_tools().items():
            earlier = self._judged.get(name)
            if earlier is not None and earlier[0] is tool:
                judged[name] = earlier
            else:
                judged[name] = (tool, *_judge(handle.name, name, tool))
            _tool, verdict, chars = judged[name]
            if isinstance(verdict, str):
                self._left_out(handle, name, verdict)
            elif chars > budget:
                self._left_out(handle, name, f"the connector tools would take more than 1/{TOOLS_MAX_DIVISOR}"
                                             f" of context_chars ({self.agent.context_chars})")
            else:
                budget -= chars
                offered_now[name] = (handle, tool, verdict)
        self._judged = judged  # only the tools listed now: bounded by the listings
        return offered_now

    def _left_out(self, handle: ToolCallPort, name: str, why: str) -> None:
        """Log a tool left out, once per tool and reason (remembered up to NOT_OFFERED_REMEMBERED)."""
        if (name, why) in self._not_offered:
            return
        if len(self._not_offered) >= NOT_OFFERED_REMEMBERED:
            self._not_offered.clear()  # a connector renaming its tools endlessly: warn again rather than grow
        self._not_offered.add((name, why))
        self._log.warning("agent.tool_not_offered", connector=handle.name, tool=name, reason=why)

    async def judge_new_tools(self) -> None:
        """Judge the tools listed since the last turn in a worker thread, so a hostile listing never holds the loop.

        Marking and bounding 256 tools of hostile text costs up to a few hundred
        milliseconds (tests/bench/bench_tool_text.py); `specs()` then finds each
        judgement ready, keyed by the listed tool object.
        """
        new = [(handle.name, name, tool) for name, (handle, tool) in self.connector_tools().items()
               if (earlier := self._judged.get(name)) is None or earlier[0] is not tool]
        if not new:
            return
        verdicts = await anyio.to_thread.run_sync(lambda: [_judge(*entry) for entry in new], abandon_on_cancel=True)
        self._judged.update({name: (tool, *verdict) for (_connector, name, tool), verdict in zip(new, verdicts)})

    def specs(self) -> list[ToolSpec]:
        """Host tools first, then each heard connector's MCP tools, as the agent's `tools` globs allow."""
        specs = [spec for spec in HOST_TOOLS if offered(self.agent, spec.name)]
        specs.extend(spec for spec in PEER_TOOLS if self._peer_tool_offered(spec.name))
        specs.extend(spec for _handle, _tool, spec in self.offered_connector_tools().values())
        return specs

    # --- calling -----------------------------------------------------------------------

    async def call(self, call: ToolCall, *, speech: Publisher | None = None) -> ToolOutcome:
        """Run one call; every failure is an error result the model reads, logged once here.

        `speech`: the turn's `mcplhost.agents.turns.reply.TurnSpeech`, which `channel_publish` queues through.
        """
        started = anyio.current_time()
        try:
            outcome = await self._dispatch(call, speech)
        except Exception as exc:  # a bug of ours must not fail the turn either
            self._log.error("agent.tool_crashed", tool=call.name, exc_info=True)
            outcome = failure(f"{call.name} failed inside the host ({type(exc).__name__})")
        outcome = redacted_outcome(outcome, self.store.secrets)  # before the model or the store sees it
        self._log.info("agent.tool_called", tool=call.name, call=call.id, error=outcome.is_error,
                       seconds=round(anyio.current_time() - started, 3))
        return outcome

    async def _dispatch(self, call: ToolCall, speech: Publisher | None = None) -> ToolOutcome:
        if not isinstance(call.arguments, dict):
            return failure(f"{call.name}: the arguments must be a JSON object")
        if call.name in {spec.name for spec in HOST_TOOLS}:
            if not offered(self.agent, call.name):
                return failure(f"{call.name} is not one of your tools")
            if call.name == "channel_list":
                return self.channel_list()
            if call.name == "channel_open":
                return await self.channel_open(call.arguments)
            if call.name == "channel_publish":
                return await self.channel_publish(call.arguments, speech)
            return await self.history_search(call.arguments)
        if call.name in PEER_TOOL_NAMES:
            if self.peers is None or not self._peer_tool_offered(call.name):
                return failure(f"{call.name} is not one of your tools")
            return await self._peer_call(self.peers, call.name, call.arguments)
        tool = self.offered_connector_tools().get(call.name)
        if tool is None:
            return failure(f"{call.name} is not one of your tools now (unknown, or its connector is not serving)")
        handle, mcp_tool, _spec = tool
        secret = self.store.secrets.find_json(call.arguments)
        if secret is not None:  # docs/agents.md#secrets: refused, never sent to the connector
            self._log.info("agent.tool_refused", tool=call.name, reason=SECRET, variable=secret)
            return failure(f"{call.name} was not called: its arguments hold the value of the secret {secret}"
                           f" (refused, reason {SECRET})")
        return await self._connector_call(handle, mcp_tool.name, call.arguments)

    async def _connector_call(self, handle: ToolCallPort, tool: str, arguments: dict[str, Any]) -> ToolOutcome:
        timeout = self.agent.tool_timeout_s
        try:
            raw = await handle.request(TOOLS_CALL, {"name": tool, "arguments": arguments}, timeout=timeout,
                                       result_type=Raw)
        except RequestTimeout as exc:
            await self._cancel(handle, exc)
            return failure(f"{handle.name}{SEPARATOR}{tool} timed out after {timeout:g} s; the call was cancelled")
        except RemoteError as exc:
            return failure(f"{handle.name}{SEPARATOR}{tool} answered error {exc.code}: {cut_error(exc.message)}")
        except (ConnectorNotReady, LineTooLong) as exc:  # LineTooLong: the arguments pass the connector's line cap
            return failure(f"{handle.name}{SEPARATOR}{tool} was not called: {cut_error(exc)}")
        # In a worker thread: a result of a million blocks costs the connector's call, not the loop.
        blocks, is_error = await anyio.to_thread.run_sync(call_result_blocks, raw, abandon_on_cancel=True)
        return ToolOutcome(blocks=blocks, is_error=is_error)

    async def _cancel(self, handle: ToolCallPort | ChannelOpenPort, exc: RequestTimeout) -> None:
        """MCP notifications/cancelled for the request we stopped waiting for (best effort)."""
        if exc.request_id is None:
            return
        try:
            with anyio.move_on_after(CANCEL_SEND_TIMEOUT_S):
                await handle.notify("notifications/cancelled", {"requestId": exc.request_id, "reason": "timeout"})
        except ConnectorNotReady:
            pass  # its life ended meanwhile: nothing is left to cancel

    # --- peer tools (docs/peers.md) --------------------------------------------------------

    def _peer_tool_offered(self, name: str) -> bool:
        return self.peers is not None and self.peers.tree.has_peers(self.agent.name) and offered(self.agent, name)

    async def _peer_call(self, peers: PeerService, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        """task_send_message or task_list; a refusal status is an answer, bad arguments a failed call."""
        try:
            if name == "task_list":
                rows = peers.listing(self.agent.name, arguments.get("scope"))
                return as_text({"agents": [{**row, "title": listed_label(row["title"])} for row in rows]})
            sent = await peers.send(self.agent.name, arguments.get("target"), arguments.get("message"),
                                    arguments.get("dispatch"))
            if sent.delivered is not None and self.woken is not None:
                self.woken(sent.delivered)  # accepted: the idle target wakes for it now
            answer = sent.answer
            # `target` is the model's own argument, echoed back: bounded and marked like any text it may carry.
            target = answer["target"]
            shown = target if len(target) <= PEER_TARGET_SHOWN_CHARS else target[:PEER_TARGET_SHOWN_CHARS] + "…"
            return as_text({**answer, "target": marked(shown)})
        except PeerRefusal as exc:
            return failure(str(exc))

    # --- host tools --------------------------------------------------------------------

    def _heard_channels(self) -> list[tuple[ChannelOpenPort, Channel]]:
        return [(handle, channel) for handle in heard_connectors(self.handles, self.agent)
                for channel in handle.channels() if heard_by(self.agent.hears, handle.name, channel.id)]

    def channel_list(self) -> ToolOutcome:
        """The heard channels (at most CHANNEL_LIST_MAX), every connector-written string marked and bounded."""
        listable = self._heard_channels()
        channels = [{"channel": marked(f"{handle.name}/{channel.id}"), "label": listed_label(channel.label),
                     "direction": channel.direction,
                     "open": (handle.name, channel.id) in self._opened or bool(channel.initiallyOpen)}
                    for handle, channel in listable[:CHANNEL_LIST_MAX]]
        answer: dict[str, Any] = {"channels": channels}
        if len(listable) > CHANNEL_LIST_MAX:
            answer["notListed"] = len(listable) - CHANNEL_LIST_MAX
        return as_text(answer)

    def resolve(self, name: str) -> tuple[ChannelOpenPort, Channel] | str:
        """The one heard channel `name` means (`connector/id`, or a bare id or label), or why there is none."""
        channels = self._heard_channels()
        exact = [(h, c) for h, c in channels if f"{h.name}/{c.id}" == name]
        if exact:
            return exact[0]
        named = [(h, c) for h, c in channels if name in (c.id, c.label)]
        if len(named) == 1:
            return named[0]
        return "names no channel you hear" if not named else f"names {len(named)} channels; use connector/channel-id"

    async def channel_open(self, arguments: dict[str, Any]) -> ToolOutcome:
        name = arguments.get("channel")
        if not isinstance(name, str) or not name:
            return failure("channel_open needs `channel`, a string")
        history = arguments.get("history", BACKSCROLL_DEFAULT)
        if not isinstance(history, int) or isinstance(history, bool) or history < 0:
            return failure("channel_open: `history` is a whole number of messages, 0 or more")
        history = min(history, MAX_BACKSCROLL)
        found = self.resolve(name)
        if isinstance(found, str):
            return failure(f"channel_open: {json.dumps(name, ensure_ascii=False)} {found}")
        handle, channel = found
        where = f"{handle.name}/{channel.id}"
        if "channels.lifecycle" not in handle.grant:
            return failure(f"channel_open: {where} cannot be opened (its connector does not hold channels.lifecycle)")
        timeout = self.agent.tool_timeout_s
        try:
            result = await handle.open_channel(channel.id, timeout=timeout, history=history)
        except RequestTimeout as exc:
            await self._cancel(handle, exc)
            return failure(f"channel_open: {where} was not opened within {timeout:g} s")
        except RemoteError as exc:
            return failure(f"channel_open: {where} refused, error {exc.code}: {cut_error(exc.message)}")
        except (ConnectorNotReady, KeyError, ConnectorProtocolError) as exc:
            return failure(f"channel_open: {where} was not opened ({type(exc).__name__}: {cut_error(exc)})")
        self._opened.add((handle.name, channel.id))
        blocks, kept, skipped = backscroll_blocks(handle, channel, result.backscroll(), self.clock_ms())
        summary = f"[host] opened {marked(where)}: {kept} recent message(s)" + (
            f", {skipped} malformed entr{'y' if skipped == 1 else 'ies'} skipped" if skipped else "") + (
            " (the connector sent fewer than asked: its history is truncated)" if result.historyTruncated else "")
        return ToolOutcome(blocks=[{"type": "text", "text": summary}, *blocks])

    async def channel_publish(self, arguments: dict[str, Any], speech: Publisher | None) -> ToolOutcome:
        """Queue a publish through the turn's speech (docs/agents.md#routing): `queued` or a refusal."""
        channel, text, thread = arguments.get("channel"), arguments.get("text"), arguments.get("thread")
        if not isinstance(channel, str) or not channel or not isinstance(text, str):
            return failure("channel_publish needs `channel` and `text`, strings")
        if thread is not None and (not isinstance(thread, str) or not thread or len(thread) > MAX_THREAD_CHARS):
            return failure(f"channel_publish: `thread` is a non-empty string of at most {MAX_THREAD_CHARS} characters")
        if not text.strip():
            return failure("channel_publish: `text` is empty; nothing was sent")
        if speech is None:
            return failure("channel_publish works only inside a turn")
        return as_text(await speech.publish(channel, text, thread))  # a refusal is an answer, not a failure

    async def history_search(self, arguments: dict[str, Any]) -> ToolOutcome:
        """Search what the agent hears, in a worker thread (mcplhost/store/readers.py), under one deadline.

        The deadline is the lesser of SEARCH_DEADLINE_S and the agent's
        tool_timeout_s; a search it cuts short answers with what it found
        and says so (`stoppedEarly`), so the model knows older items were not searched.
        """
        query, as_regex, limit = arguments.get("query"), arguments.get("regex", False), arguments.get(
            "limit", SEARCH_LIMIT_DEFAULT)
        if not isinstance(query, str) or not query:
            return failure("history_search needs `query`, a non-empty string")
        if not isinstance(as_regex, bool) or isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            return failure("history_search: `regex` is a boolean and `limit` a positive integer")
        deadline_s = min(SEARCH_DEADLINE_S, self.agent.tool_timeout_s)
        try:
            found = await search_items(self.store, query, as_regex=as_regex, limit=min(limit, SEARCH_LIMIT_MAX),
                                       where=self.heard, deadline_s=deadline_s)
        except SearchError as exc:
            return failure(f"history_search: {exc}")
        # Snippets quote stored bodies, which the inbound pipeline marked already; ids and names are marked here.
        hits = [{"id": hit["id"], "channel": marked(f"{hit['serverId']}/{hit['channelId']}" if hit["channelId"]
                                                    else f"{hit['serverId']} (unscoped)"),
                 "participant": marked(hit["participant"]) if isinstance(hit["participant"], str) else None,
                 "createdAt": hit["createdAt"], "snippet": hit["snippet"]} for hit in found.hits]
        answer: dict[str, Any] = {"hits": hits}
        if found.timed_out:
            answer["timedOut"] = found.timed_out  # items the expression could not be tested on
        if found.stopped_early:
            answer["stoppedEarly"] = (f"the search stopped after {deadline_s:g} s; items older than id"
                                      f" {found.oldest_searched} were not searched" if found.oldest_searched
                                      else f"the search stopped after {deadline_s:g} s before testing any item")
        return as_text(answer)
