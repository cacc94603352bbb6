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

A connector's tool listing is untrusted text too: how each listed tool is
marked, bounded and judged is tools/listing.py's; the host tools' specs and
`channel_open`'s backscroll are tools/host_tools.py's; what a call answers
is tools/outcome.py's. Channel descriptors reach the model through
`channel_list` and `channel_open`: ids and labels marked, a label cut
(speech/notices.py `shown_label`), at most CHANNEL_LIST_MAX channels listed.

A tool that fails (an error answer, a timeout, a connector not serving, bad
arguments) is a result the model reads (`ToolOutcome.is_error`), never an
exception: it never fails the turn and never counts against the connector.
A timed-out `tools/call` is followed by MCP `notifications/cancelled`.

Connector tools are called under the agent's `tool_timeout_s`, not the
connector's `request_timeout_s`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import structlog
from msgspec import Raw

from mcplhost.agents.hearing import heard_by, heard_connectors
from mcplhost.agents.model import ToolCall, ToolSpec
from mcplhost.agents.tools.host_tools import (
    BACKSCROLL_DEFAULT,
    CHANNEL_LIST_MAX,
    HOST_TOOLS,
    MAX_BACKSCROLL,
    MAX_THREAD_CHARS,
    PEER_TARGET_SHOWN_CHARS,
    PEER_TOOL_NAMES,
    PEER_TOOLS,
    SEARCH_LIMIT_DEFAULT,
    SEARCH_LIMIT_MAX,
    Publisher,
    backscroll_blocks,
    listed_label,
)
from mcplhost.agents.tools.listing import SEPARATOR, TOOL_NAME, TOOLS_MAX_DIVISOR, judge_listed, offered
from mcplhost.agents.tools.outcome import (
    TOOLS_CALL,
    ToolOutcome,
    as_text,
    call_result_blocks,
    cut_error,
    failure,
    marked,
    redacted_outcome,
)
from mcplhost.config import AgentConfig
from mcplhost.ingest import Stored
from mcplhost.peers.service import PeerRefusal, PeerService
from mcplhost.protocol.answers import ListedTool
from mcplhost.protocol.channels import Channel
from mcplhost.protocol.errors import ConnectorProtocolError
from mcplhost.protocol.ports import ChannelOpenPort, ConnectorNotReady, ToolCallPort, ToolPort
from mcplhost.rpc import LineTooLong, RemoteError, RequestTimeout
from mcplhost.speech.withhold import SECRET
from mcplhost.store import Store
from mcplhost.store.readers import SEARCH_DEADLINE_S, SearchError, search_items
from mcplhost.store.search_query import SearchFilter

log = structlog.get_logger()

#: A notifications/cancelled that cannot be queued within this long is given up.
CANCEL_SEND_TIMEOUT_S = 1.0
#: Tools left out whose warning is remembered, so it is logged once per tool.
NOT_OFFERED_REMEMBERED = 4096


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
                judged[name] = (tool, *judge_listed(handle.name, name, tool))
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
        verdicts = await anyio.to_thread.run_sync(lambda: [judge_listed(*entry) for entry in new], abandon_on_cancel=True)
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
