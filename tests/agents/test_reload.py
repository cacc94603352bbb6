"""Agents updated in place by a config reload (mcplhost/agents/runtime.py `reload`): new settings apply to the
next wake, never in the middle of a turn; a real store and writer, the runtime fed by a real Ingest."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest

from mcplhost.agents.model import ModelRequest, ModelResponse, OnText, Usage
from mcplhost.config import BackendConfig
from mcplhost.errors import ConfigError

from ..peers.test_runtime import completed, runtime_of
from .support import agent_config, heard, scripted


def drafts(rows: list) -> list[str]:
    return [r.content[0]["text"] for r in rows if r.metadata.get("kind") == "draft"]


class Gated:
    """A backend whose first call waits for `gate`."""

    name = "scripted"

    def __init__(self) -> None:
        self.gate = anyio.Event()
        self.entered = anyio.Event()
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse:
        self.requests.append(request)
        self.entered.set()
        await self.gate.wait()
        return ModelResponse(text="done", usage=Usage(input_tokens=1, output_tokens=1), model="t")

    async def aclose(self) -> None:
        pass


class TestReload:
    async def test_a_changed_backend_and_prompt_answer_the_next_wake(self, tmp_path: Path) -> None:
        before = agent_config("scout", system_prompt="You are A.", backend=scripted("one"))
        async with runtime_of(tmp_path, [before], {}) as (runtime, ingest, store):
            await heard(ingest, "first")
            await completed(store, "scout", 1)
            after = msgspec.structs.replace(before, system_prompt="You are B.", backend=scripted("two"))
            assert await runtime.reload([after]) == ["scout"]
            assert await runtime.reload([after]) == []  # the same settings again: nothing to change
            await heard(ingest, "second")
            await completed(store, "scout", 2)
            assert drafts(await store.items.list(agent="scout")) == ["one", "two"]
            assert runtime.config.agents == [after]

    async def test_a_reload_waits_for_the_turn_in_progress_to_end(self, tmp_path: Path) -> None:
        gated = Gated()
        before = agent_config("scout")
        async with runtime_of(tmp_path, [before], {"scout": gated}) as (runtime, ingest, store):
            await heard(ingest, "long one")
            await gated.entered.wait()
            reloaded = anyio.Event()

            async def reload() -> None:
                await runtime.reload([msgspec.structs.replace(before, debounce_ms=5, max_wait_ms=5)])
                reloaded.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(reload)
                await anyio.wait_all_tasks_blocked()
                assert not reloaded.is_set() and runtime.runners["scout"].agent.debounce_ms == 0
                gated.gate.set()
            assert runtime.runners["scout"].agent.debounce_ms == 5
            (turn,) = await completed(store, "scout", 1)
            assert turn.outcome == "completed"  # the turn ran to its end on the settings it began with

    async def test_an_agent_added_starts_at_the_stores_end_and_one_removed_stops(self, tmp_path: Path) -> None:
        """A new agent wakes for what arrives after the reload (its cursor starts at the end, as for any new agent);
        a removed agent runs no more turns."""
        scout, writer = agent_config("scout", backend=scripted("s")), agent_config("writer", backend=scripted("w"))
        async with runtime_of(tmp_path, [scout], {}) as (runtime, ingest, store):
            await heard(ingest, "before")
            await completed(store, "scout", 1)
            assert await runtime.reload([writer]) == ["scout", "writer"]
            assert list(runtime.runners) == ["writer"] and runtime.config.agents == [writer]
            await heard(ingest, "after")
            (turn,) = await completed(store, "writer", 1)
            assert len(turn.wake_item_ids) == 1  # only the item after the reload
            assert len(await store.turns.list(agent="scout")) == 1

    async def test_an_edited_prompt_file_is_a_changed_agent(self, tmp_path: Path) -> None:
        """The same table, another text in its system_prompt_file: the reload changes the agent's prompt."""
        prompt = tmp_path / "scout.md"
        prompt.write_text("You are A.")
        scout = agent_config("scout", system_prompt_file=str(prompt))
        async with runtime_of(tmp_path, [scout], {}) as (runtime, _ingest, _store):
            assert await runtime.reload([scout]) == []
            prompt.write_text("You are B.")
            assert await runtime.reload([scout]) == ["scout"]
            assert runtime.runners["scout"].state.system_prompt == "You are B."

    async def test_a_problem_with_one_agent_changes_no_agent(self, tmp_path: Path) -> None:
        """All or nothing: scout's new backend cannot be built, writer's new prompt file is gone, and reader's new
        settings are fine: none of them changes, and the error names each problem by its path."""
        scout, writer = agent_config("scout", backend=scripted("s")), agent_config("writer", system_prompt="W")
        reader = agent_config("reader")
        async with runtime_of(tmp_path, [scout, writer, reader], {}) as (runtime, _ingest, _store):
            before = {name: (r.agent, r.state.backend, r.state.system_prompt)
                      for name, r in runtime.runners.items()}
            broken = msgspec.structs.replace(scout, backend=BackendConfig(kind="openai", model="m", base_url="::::"))
            gone = msgspec.structs.replace(writer, system_prompt=None, system_prompt_file=str(tmp_path / "gone.md"))
            with pytest.raises(ConfigError) as refused:
                await runtime.reload([broken, gone, msgspec.structs.replace(reader, debounce_ms=9)])
            assert [p.split(":")[0] for p in refused.value.problems] == ["agents[0].backend",
                                                                         "agents[1].system_prompt_file"]
            assert {name: (r.agent, r.state.backend, r.state.system_prompt)
                    for name, r in runtime.runners.items()} == before
