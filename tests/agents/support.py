"""Shared pieces for the agents tests: a real store and writer, heard items through the real pipeline, backends.

    async with agent_store(tmp_path) as (store, writer, ingest):
        ids = await heard(ingest, "hello", "again")
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import structlog

from mcplhost.agents.model import BackendError, ModelRequest, ModelResponse, OnText, Usage
from mcplhost.config import AgentConfig, BackendConfig
from mcplhost.ingest import Ingest
from mcplhost.protocol.intake import AdmittedMessage
from mcplhost.speech.echoes import EchoMemory
from mcplhost.store import Store, open_store
from mcplhost.store.writer import GroupWriter

ROOM = "disc:g1:room"
ADDRESSED = ["chat:addressed", "chat:mention"]


def agent_config(name: str = "scout", **fields: Any) -> AgentConfig:
    """An agent hearing everything, waking on every item, with no debounce unless told."""
    fields.setdefault("wake_on", ["all"])
    fields.setdefault("debounce_ms", 0)
    fields.setdefault("max_wait_ms", 0)
    return AgentConfig(name=name, **fields)


def scripted(*replies: Any, **fields: Any) -> BackendConfig:
    return BackendConfig(kind="scripted", script=list(replies), **fields)


def reply_with_tools(text: str, *calls: tuple[str, dict[str, Any]]) -> str:
    """A scripted reply (JSON object string) that asks for tool calls."""
    return json.dumps({"text": text, "tool_calls": [{"name": name, "arguments": args} for name, args in calls]})


@asynccontextmanager
async def agent_store(folder: Path) -> AsyncIterator[tuple[Store, GroupWriter, Ingest]]:
    """A real SQLite store in `folder`, its running group writer, and an Ingest writing through it."""
    async with open_store(folder / "host.db") as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        yield store, writer, Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox))
        tg.cancel_scope.cancel()


_counter = iter(range(1, 10**9))


async def heard(ingest: Ingest, *bodies: str, channel: str = ROOM, tags: list[str] | None = None,
                server: str = "disc") -> list[int]:
    """Store one channel message per body through the inbound pipeline; their item ids."""
    messages = [AdmittedMessage(channel_id=channel, label="#room", message_id=f"m-{next(_counter)}",
                                participant="Alice", content=[{"type": "text", "text": body}],
                                tags=list(ADDRESSED if tags is None else tags))
                for body in bodies]
    await ingest.store_messages(server, "channels/incoming", messages)
    items = await ingest.store.items.list()
    wanted = {m.message_id for m in messages}
    return [item.id for item in items if item.metadata.get("messageId") in wanted]


class RecordingBackend:
    """A backend that answers `text` and records each request it was given (and when)."""

    name = "scripted"

    def __init__(self, text: str = "ok", *, tokens: int = 5) -> None:
        self.text = text
        self.tokens = tokens
        self.requests: list[ModelRequest] = []
        self.called_at: list[float] = []
        self.closed = False

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse:
        self.requests.append(request)
        self.called_at.append(anyio.current_time())
        return ModelResponse(text=self.text, usage=Usage(input_tokens=self.tokens, output_tokens=self.tokens),
                             model="recording-1")

    async def aclose(self) -> None:
        self.closed = True


class FailingBackend(RecordingBackend):
    """A backend whose every call fails, as an SDK's exhausted retries do."""

    def __init__(self, reason: str = "server_error") -> None:
        super().__init__()
        self.reason = reason

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse:
        self.requests.append(request)
        raise BackendError(self.reason, "HTTP 500 after 2 retries")


class HangingBackend(RecordingBackend):
    """A backend that never answers (a model behind a dead network), until cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = anyio.Event()

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse:
        self.requests.append(request)
        self.entered.set()
        await anyio.sleep_forever()
        raise AssertionError("not reached")
