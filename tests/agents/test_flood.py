"""A turn under a flood (docs/agents.md#compilation, Budget): what the turn is about is never trimmed away.

One channel floods at about 1,000 items a second. A mention arrives; the
items of its debounce alone exceed `context_chars`; the turn's first
request still holds the mention. The model calls a tool, which returns
only after hundreds more items (more than the runtime's window of newest
rows, made small here); the next request still holds the call, its result
and the mention.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from mcplhost.agents import wiring as wiring_module
from mcplhost.agents.model import ModelRequest, ModelResponse, OnText, ToolCall, Usage
from mcplhost.agents.turns.compiler import request_chars

from .support import agent_config, agent_store, heard
from .test_runtime import running, turns_of

#: The flood's pace: a batch of this many items ...
BATCH = 10
#: ... every this many seconds: about 1,000 items a second.
BATCH_EVERY_S = 0.01
#: The runtime's window of newest rows, made small so the tool's wait pushes the turn's rows out of it.
WINDOW = 300
MENTION = "@scout what is the time?"


class Flood:
    """Ambient items on one channel, at a steady pace, counted; `reached(n)` waits for the n-th."""

    def __init__(self) -> None:
        self.written = 0
        self._changed = anyio.Event()

    async def run(self, ingest: Any) -> None:
        while True:
            await heard(ingest, *(f"chatter {self.written + n} " + "x" * 80 for n in range(BATCH)), tags=[])
            self.written += BATCH
            self._changed.set()
            self._changed = anyio.Event()
            await anyio.sleep(BATCH_EVERY_S)  # the pace of the load, not a wait for anything

    async def reached(self, count: int) -> None:
        while self.written < count:
            await self._changed.wait()


class ToolThenAnswer:
    """A model that calls history_search first and answers after; it records each request."""

    name = "scripted"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse:
        self.requests.append(request)
        if len(self.requests) == 1:
            return ModelResponse(text="", tool_calls=[ToolCall(id="c1", name="history_search",
                                                               arguments={"query": "time"})], usage=Usage())
        return ModelResponse(text="noon", usage=Usage())

    async def aclose(self) -> None:
        pass


class SlowTools:
    """The agent's real tools, but a call returns only once the flood has written `more` items past its start."""

    def __init__(self, inner: Any, flood: Flood, more: int) -> None:
        self._inner, self._flood, self._more = inner, flood, more

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def call(self, call: ToolCall, **kwargs: Any) -> Any:
        await self._flood.reached(self._flood.written + self._more)
        return await self._inner.call(call, **kwargs)


def shown(request: ModelRequest) -> list[str]:
    return [block["text"] for message in request.messages for block in message.content if block["type"] == "text"]


async def test_a_tool_call_under_a_flood_keeps_the_mention_the_call_and_its_result(tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(wiring_module, "CONTEXT_ROWS", WINDOW)
    agent = agent_config(wake_on=["addressed"], debounce_ms=300, max_wait_ms=3000, context_chars=20_000)
    backend, flood = ToolThenAnswer(), Flood()
    async with agent_store(tmp_path) as (store, writer, _), \
            running(store, writer, [agent], {"scout": backend}) as (runtime, ingest), anyio.create_task_group() as tg:
        runner = runtime.runners["scout"]
        runner.state.toolbox = SlowTools(runner.state.toolbox, flood, WINDOW + 100)
        tg.start_soon(flood.run, ingest)
        await flood.reached(100)
        (mention,) = await heard(ingest, MENTION)
        (turn,) = await turns_of(store, "scout", 1, timeout=30)
        tg.cancel_scope.cancel()
    first, second = backend.requests
    assert turn.outcome == "completed" and turn.wake_item_ids == [mention]
    # The debounce's items alone exceed the limit: the oldest ambient items went, the mention stayed.
    assert any(MENTION in text for text in shown(first)) and not any("chatter 0 " in text for text in shown(first))
    assert request_chars(first) <= agent.context_chars
    calls = [m for m in second.messages if m.tool_calls]
    results = [m for m in second.messages if m.role == "tool"]
    assert [c.name for m in calls for c in m.tool_calls] == ["history_search"] and [m.tool_call_id for m in results] == [
        "c1"]
    assert second.messages.index(results[0]) == second.messages.index(calls[0]) + 1
    assert any(MENTION in text for text in shown(second)) and request_chars(second) <= agent.context_chars
