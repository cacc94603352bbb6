"""An agent is an exception boundary, in a real Host: a bug while handling one wake fails that turn only.

The fault comes through the agents runtime's test seam
(`test_fault_before_wake`), standing in for a bug in the code that handles
a wake; the connector, the store and the scripted backend are real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from mcplhost.agents import agent_loop
from mcplhost.config import AgentConfig, BackendConfig
from mcplhost.supervisor.handle import State

from ..harness import CHAT_GRANT, CHAT_MANIFEST, config_with, running_host, scripted, wait_for

ROOM = "disc:g1:room"
REGISTER = {"request": "channels/register", "params": {"channels": [
    {"id": ROOM, "type": "disc", "direction": "bidirectional", "address": {}, "label": "#room"}]}}


def incoming(message_id: str, body: str) -> dict[str, Any]:
    return {"request": "channels/incoming", "params": {"messages": [
        {"channelId": ROOM, "messageId": message_id, "author": {"id": "u-alice", "name": "Alice"},
         "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": body}],
         "tags": ["chat:addressed"]}]}}


class TestAgentBoundary:
    async def test_a_turn_that_raises_is_a_failed_turn_with_its_notice_and_the_agent_answers_the_next_wake(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        faults: list[tuple[int, ...]] = []

        def fault(agent: str, wake: Any) -> None:
            if not faults:
                faults.append(wake.item_ids)
                raise RuntimeError("a bug while handling the wake")

        monkeypatch.setattr(agent_loop, "test_fault_before_wake", fault)
        connector = scripted("disc", {"manifest": CHAT_MANIFEST, "steps": [
            REGISTER, incoming("m-1", "scout, first"), {"wait": "test/go"},
            incoming("m-2", "scout, second")]}, tmp_path, grant=CHAT_GRANT)
        agent = AgentConfig(name="scout", wake_on=["addressed"], debounce_ms=0,
                            backend=BackendConfig(kind="scripted", script=["answered: {{echo}}"]))
        config = msgspec.structs.replace(config_with(tmp_path, connector), agents=[agent])
        async with running_host(config) as host:
            store = host.agents.store
            await wait_for(lambda: faults, timeout=20)

            async def ended() -> list[Any]:
                return [t for t in await store.turns.list() if t.outcome is not None]

            await _until(lambda: ended(), 1)
            await host.connectors["disc"].notify("test/go", {})  # the connector sends its second message now
            turns = await _until(lambda: ended(), 2)
            rows = [row for row in await store.items.list() if row.agent == "scout"]
            assert host.connectors["disc"].state is State.READY
        failed, answered = turns
        assert failed.outcome == "failed" and list(failed.wake_item_ids) == list(faults[0])
        assert failed.reason == "internal_error" and answered.reason is None
        assert answered.outcome == "completed"
        kinds = [row.metadata.get("kind") for row in rows]
        assert "turn-failed" in kinds and kinds.index("turn-failed") < kinds.index("draft")
        notice = rows[kinds.index("turn-failed")]
        assert notice.metadata["reason"] == "RuntimeError"
        assert any(row.content[0]["text"] == "answered: scout, second" for row in rows if row.role == "assistant")


async def _until(read: Any, count: int) -> list[Any]:
    with anyio.fail_after(20):
        while len(found := await read()) < count:
            await anyio.sleep(0.02)
    return found
