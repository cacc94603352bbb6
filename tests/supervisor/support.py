"""Helpers for the supervisor tests: a real intake, and what the logs and records say happened."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import structlog

from mcplhost.ingest import Ingest
from mcplhost.speech.echoes import EchoMemory
from mcplhost.store import open_store
from mcplhost.store.writer import GroupWriter

from ..harness import record


@asynccontextmanager
async def real_intake(folder: Path) -> AsyncIterator[Ingest]:
    """The host's real intake: the inbound pipeline and a group writer on folder/host.db.

    A context manager rather than a fixture, so its task group opens and closes in the test's own task.
    """
    async with open_store(folder / "host.db") as store:
        writer = GroupWriter(store)
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            yield Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox))
            tg.cancel_scope.cancel()


def events(logs: list[dict[str, Any]], name: str, connector: str | None = None) -> list[dict[str, Any]]:
    """The captured events called `name`, about `connector` if given."""
    return [e for e in logs if e["event"] == name and (connector is None or e.get("connector") == connector)]


def starts(folder: Path, name: str) -> list[dict[str, Any]]:
    """Each process life of scripted connector `name`: its "start" record (pid, t, maybe env)."""
    return [e for e in record(folder, name).events if e["kind"] == "start"]


def chat_steps(name: str, count: int, *, pause: float = 0.0) -> list[dict[str, Any]]:
    """Steps that register `name`:g1:room and send `count` messages into it, one request each."""
    channel = f"{name}:g1:room"
    steps: list[dict[str, Any]] = [{"request": "channels/register", "params": {"channels": [
        {"id": channel, "type": name, "label": "#room", "direction": "bidirectional", "address": {}}]}}]
    for n in range(count):
        if pause:
            steps.append({"sleep": pause})
        steps.append({"request": "channels/incoming", "params": {"messages": [
            {"channelId": channel, "messageId": f"m-{n}", "author": {"id": "u1", "name": "Alice"},
             "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": f"{name} says {n}"}]}]}})
    return steps


def accepted(answer: dict[str, Any]) -> bool:
    """Whether a recorded channels/incoming answer accepted its (single) message."""
    results = answer.get("result", {}).get("results", [])
    return bool(results) and all(r.get("accepted") for r in results)
