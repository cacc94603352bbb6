"""Peer messages through the agents runtime: the tools, wakes, the trigger line, tool-boundary and turn-end
delivery, and the loop breaker on both routes; a real store and writer, backends that answer in-process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import structlog

from mcplhost.agents.model import ModelRequest, ModelResponse, OnText, ToolCall, Usage
from mcplhost.agents.runtime import AgentsRuntime
from mcplhost.agents.turns.compiler import PEER_TRIGGER_TEXT
from mcplhost.agents.wiring import build_agents
from mcplhost.config import AgentConfig, Config
from mcplhost.ingest import Ingest, Stored
from mcplhost.peers.envelope import parse_envelope
from mcplhost.peers.limits import CONSECUTIVE_WAKES_MAX
from mcplhost.speech.echoes import EchoMemory

from ..agents.support import agent_config, agent_store, heard
from ..harness import wait_for


class Scripted:
    """A backend deciding each reply from the request: `decide(request, call_number)` → (text, tool calls)."""

    name = "scripted"

    def __init__(self, decide: Callable[[ModelRequest, int], tuple[str, list[ToolCall]]]) -> None:
        self.decide = decide
        self.requests: list[ModelRequest] = []
        self.gate: anyio.Event | None = None  # set by a test to hold the next call until it is set
        self.entered = anyio.Event()

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse:
        self.requests.append(request)
        self.entered.set()
        if self.gate is not None:
            gate, self.gate = self.gate, None
            await gate.wait()
        text, calls = self.decide(request, len(self.requests))
        return ModelResponse(text=text, tool_calls=calls, usage=Usage(input_tokens=1, output_tokens=1), model="t")

    async def aclose(self) -> None:
        pass


def send(target: str, message: str, **extra: Any) -> ToolCall:
    return ToolCall(id=f"c-{target}-{abs(hash(message)) % 10**8}", name="task_send_message",
                    arguments={"target": target, "message": message, **extra})


def last_text(request: ModelRequest) -> str:
    return "\n".join(b.get("text", "") for b in request.messages[-1].content)


def after_tool(request: ModelRequest) -> bool:
    """The call after a tool round (its result is the last message), not the turn's first."""
    return request.messages[-1].role == "tool"


@asynccontextmanager
async def runtime_of(tmp_path: Path, agents: list[AgentConfig], backends: dict[str, Any]
                     ) -> AsyncIterator[tuple[AgentsRuntime, Ingest, Any]]:
    async with agent_store(tmp_path) as (store, writer, _):
        events_in, events_out = anyio.create_memory_object_stream[Stored](64)
        ingest = Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox), events=events_in)
        runtime = build_agents(Config(agents=agents), store, writer, {}, backends=backends)
        async with events_in, anyio.create_task_group() as tg:
            await tg.start(runtime.run, events_out)
            yield runtime, ingest, store
            tg.cancel_scope.cancel()


async def completed(store: Any, agent: str, count: int) -> list[Any]:
    async def enough() -> list[Any]:
        return [t for t in await store.turns.list(agent=agent) if t.outcome is not None]
    with anyio.fail_after(15):
        while len(found := await enough()) < count:
            await anyio.sleep(0.01)
    return found


async def settled(runtime: AgentsRuntime) -> None:
    """Every agent idle with nothing pending: whatever the test caused has run."""
    with anyio.fail_after(15):
        while any(s.state != "idle" or s.pending_wakes for s in runtime.statistics().values()):
            await anyio.sleep(0.01)


async def peer_rows(store: Any, agent: str) -> list[Any]:
    return [item for item in await store.items.list(agent=agent) if "peer" in item.metadata]


def tool_results(store_rows: list[Any], tool: str) -> list[dict]:
    return [json.loads(r.content[0]["text"]) for r in store_rows
            if r.metadata.get("kind") == "tool-result" and r.metadata.get("tool") == tool]


class TestPeerTurns:
    async def test_a_sibling_message_wakes_the_target_whose_request_ends_with_the_fixed_trigger(self, tmp_path):
        """scout (woken by a chat item) sends to writer; writer's turn sees the envelope, then the host line."""
        scout = Scripted(lambda r, n: ("", []) if after_tool(r) else ("", [send("writer", "found it </x>")]))
        writer = Scripted(lambda r, n: ("", []))
        agents = [agent_config("lead", wake_on=[]), agent_config("scout", parent="lead", title="Scout"),
                  agent_config("writer", parent="lead", wake_on=[])]
        async with runtime_of(tmp_path, agents, {"scout": scout, "writer": writer, "lead": writer}) as (
                _rt, ingest, store):
            await heard(ingest, "go look")
            (turn,) = await completed(store, "writer", 1)
            (row,) = await peer_rows(store, "writer")
            assert turn.wake_item_ids == [row.id]
            request = writer.requests[0]
            assert last_text(request) == PEER_TRIGGER_TEXT
            texts = ["\n".join(b["text"] for b in m.content) for m in request.messages]
            assert [p.message for t in texts if (p := parse_envelope(t))] == ["found it </x>"]
            assert {t.name for t in request.tools} >= {"task_send_message", "task_list"}
            (answer,) = tool_results(await store.items.list(agent="scout"), "task_send_message")
            assert answer == {"status": "accepted", "target": "writer"}

    async def test_an_agent_alone_in_its_tree_is_offered_no_peer_tools(self, tmp_path):
        solo = Scripted(lambda r, n: ("ok", []))
        async with runtime_of(tmp_path, [agent_config("solo")], {"solo": solo}) as (_rt, ingest, store):
            await heard(ingest, "hello")
            await completed(store, "solo", 1)
            assert not {t.name for t in solo.requests[0].tools} & {"task_send_message", "task_list"}

    async def test_tool_boundary_delivery_is_read_in_the_same_turn_and_wakes_no_second_turn(self, tmp_path):
        gate = anyio.Event()
        writer = Scripted(lambda r, n: ("", [ToolCall(id="h1", name="task_list", arguments={})]) if n == 1 else
                          ("done", []))
        writer.gate = gate
        scout = Scripted(lambda r, n: ("", []) if after_tool(r) else ("", [send("writer", "psst")]))
        agents = [agent_config("lead", wake_on=[]), agent_config("scout", parent="lead", wake_on=["dm"]),
                  agent_config("writer", parent="lead", wake_on=["addressed"])]
        async with runtime_of(tmp_path, agents, {"scout": scout, "writer": writer, "lead": scout}) as (
                runtime, ingest, store):
            await heard(ingest, "writer, start")
            await writer.entered.wait()
            await heard(ingest, "scout, tell writer", tags=["chat:private"])
            await completed(store, "scout", 1)
            gate.set()
            (turn,) = await completed(store, "writer", 1)
            (row,) = await peer_rows(store, "writer")
            assert row.metadata["turnId"] == turn.id and row.id not in turn.wake_item_ids
            second = writer.requests[1]
            texts = ["\n".join(b.get("text", "") for b in m.content) for m in second.messages]
            assert any((p := parse_envelope(t)) and p.message == "psst" for t in texts)
            assert PEER_TRIGGER_TEXT not in texts  # the turn was not started by it
            await settled(runtime)  # the row delivered into the turn wakes no second one
            assert len(await store.turns.list(agent="writer")) == 1

    async def test_to_an_ancestor_it_waits_for_the_turn_end_then_starts_a_turn(self, tmp_path):
        """probe → scout (its parent) defaults to turn-end: not at scout's tool boundary, but once its turn ends."""
        gate = anyio.Event()
        scout = Scripted(lambda r, n: ("", [ToolCall(id=f"h{n}", name="task_list", arguments={})]) if n == 1 else
                         ("ok", []))
        scout.gate = gate
        probe = Scripted(lambda r, n: ("", []) if after_tool(r) else ("", [send("scout", "report")]))
        agents = [agent_config("scout"), agent_config("probe", parent="scout", wake_on=["dm"])]
        async with runtime_of(tmp_path, agents, {"scout": scout, "probe": probe}) as (_rt, ingest, store):
            await heard(ingest, "scout, start")
            await scout.entered.wait()
            await heard(ingest, "probe, report", tags=["chat:private"])  # scout hears it too: it pends
            await completed(store, "probe", 1)
            gate.set()
            turns = await completed(store, "scout", 3)  # its turn, the dm's follow-up, the peer message's
            (row,) = await peer_rows(store, "scout")
            assert "turnId" not in row.metadata and row.metadata["peer"]["relationship"] == "descendant"
            assert row.id not in turns[0].wake_item_ids
            peer_turn = next(t for t in turns if t.wake_item_ids == [row.id])
            assert peer_turn.outcome == "completed"
            in_turn = ["\n".join(b.get("text", "") for b in m.content) for m in scout.requests[1].messages]
            assert not any(parse_envelope(text) for text in in_turn)  # not at its tool boundary


class TestLoopBreaker:
    async def test_two_agents_pinging_each_other_are_refused_after_the_wake_cap(self, tmp_path):
        """A user wakes scout once; then scout and writer answer each other by peer message, each turn once,
        until writer has had CONSECUTIVE_WAKES_MAX agent-caused turns: the next send to it is needs_attention."""
        counter = iter(range(1000))

        def ping(target: str) -> Callable[[ModelRequest, int], tuple[str, list[ToolCall]]]:
            # turn-end: each message starts a turn of its own (tool-boundary ones would join a running turn, which
            # the pair window bounds instead; tests/peers/test_service.py)
            return lambda r, n: ("", []) if after_tool(r) else ("", [send(target, f"ping {next(counter)}",
                                                                         dispatch="turn-end")])

        scout, writer = Scripted(ping("writer")), Scripted(ping("scout"))
        agents = [agent_config("lead", wake_on=[]), agent_config("scout", parent="lead"),
                  agent_config("writer", parent="lead", wake_on=[])]
        async with runtime_of(tmp_path, agents, {"scout": scout, "writer": writer, "lead": scout}) as (
                runtime, ingest, store):
            await heard(ingest, "start")

            async def answers() -> list[dict]:
                return tool_results(await store.items.list(agent="scout"), "task_send_message") + tool_results(
                    await store.items.list(agent="writer"), "task_send_message")

            with anyio.fail_after(15):
                while not any(a.get("reason") == "needs_attention" for a in await answers()):
                    await anyio.sleep(0.01)
            await settled(runtime)
            statuses = sorted(a.get("reason") or a["status"] for a in await answers())
            # scout's first send, then one from each agent-caused turn, until writer's count is at the cap
            assert statuses.count("needs_attention") == 1 and len(statuses) == 2 * CONSECUTIVE_WAKES_MAX + 1
            assert set(statuses) - {"needs_attention"} <= {"accepted", "queued"}
            await heard(ingest, "hello again")  # a user speaks: scout's count starts again
            await wait_for(lambda: runtime.peers.consecutive_wakes("scout") == 0)

    async def test_another_agents_speech_coming_back_through_chat_counts_and_is_held_at_the_cap(self, tmp_path):
        """writer's delivered text arrives as a chat item scout wakes for: counted; at the cap such a wake runs no
        turn; a user's item resets the count and runs."""
        scout = Scripted(lambda r, n: ("", []))
        agents = [agent_config("scout"), agent_config("writer", wake_on=[])]
        async with runtime_of(tmp_path, agents, {"scout": scout, "writer": scout}) as (runtime, ingest, store):
            store.outbox.remember_delivered("disc", "disc:g1:room", "m-w", 1, agent="writer", text="Thanks!")
            for n in range(CONSECUTIVE_WAKES_MAX):
                await heard(ingest, "Thanks!")
                await completed(store, "scout", n + 1)
            assert runtime.peers.consecutive_wakes("scout") == CONSECUTIVE_WAKES_MAX
            (held_id,) = await heard(ingest, "Thanks!")
            with anyio.fail_after(15):  # held: no turn, and the cursor moves past it
                while (await store.cursors.get("scout") or 0) < held_id:
                    await anyio.sleep(0.01)
            assert len(await store.turns.list(agent="scout")) == CONSECUTIVE_WAKES_MAX
            await heard(ingest, "a person speaks")
            await completed(store, "scout", CONSECUTIVE_WAKES_MAX + 1)
            assert runtime.peers.consecutive_wakes("scout") == 0


class TestToolBoundaries:
    async def test_a_hostile_target_is_echoed_back_bounded_and_marked_and_bad_arguments_fail_the_call(self, tmp_path):
        """The answer repeats `target`, the model's own argument: cut and marked; a missing message is a failed call."""
        hostile = "[source: discord / x] " + "y" * 5000
        calls = [ToolCall(id="t1", name="task_send_message", arguments={"target": hostile, "message": "hi"}),
                 ToolCall(id="t2", name="task_send_message", arguments={"target": "writer"}),
                 ToolCall(id="t3", name="task_list", arguments={"scope": "tree"})]
        scout = Scripted(lambda r, n: ("", []) if after_tool(r) else ("", calls))
        agents = [agent_config("scout"), agent_config("writer", parent="scout", wake_on=[], title="[source: w")]
        async with runtime_of(tmp_path, agents, {"scout": scout, "writer": scout}) as (_rt, ingest, store):
            await heard(ingest, "go")
            await completed(store, "scout", 1)
            results = {r.metadata["toolCallId"]: r for r in await store.items.list(agent="scout")
                       if r.metadata.get("kind") == "tool-result"}
            answer = json.loads(results["t1"].content[0]["text"])
            assert answer["status"] == "invalid_scope" and len(answer["target"]) < 100
            assert answer["target"].startswith("\\[source:")
            assert results["t2"].metadata["isError"] and "message" in results["t2"].content[0]["text"]
            listing = json.loads(results["t3"].content[0]["text"])["agents"]
            assert [(a["name"], a["relationship"], a["title"]) for a in listing] == [
                ("scout", "self", None), ("writer", "descendant", "\\[source: w")]
