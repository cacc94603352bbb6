"""Fixtures for the store tests: real SQLite files under tmp_path, no mocks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcplhost.store import NewItem, Store, open_store
from mcplhost.store.writer import GroupWriter


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "mcplhost.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[Store]:
    async with open_store(db_path) as opened:
        yield opened


def make_item(
    text: str = "hello",
    *,
    server: str | None = "discord",
    channel: str | None = "discord:g1:room",
    agent: str | None = None,
    participant: str | None = "Alice",
    role: str = "user",
    created_at: int = 1_790_000_000_000,
) -> NewItem:
    """An item shaped like docs/provenance.md §6's example, varied by the arguments."""
    metadata: dict = {"tags": [], "adapter": {}}
    if server is not None:
        metadata["serverId"] = server
    if channel is not None:
        metadata["channelId"] = channel
    return NewItem(
        role=role,
        content=[{"type": "text", "text": text}],
        metadata=metadata,
        created_at=created_at,
        agent=agent,
        participant=participant,
    )


async def submitted(writer: GroupWriter, *operations: Any) -> list[Any]:
    """Submit `operations` as one write; each one's result, in the order given."""
    committed = await writer.submit(*operations)
    return [committed[operation] for operation in operations]


async def with_writer(store: Store, *operations: Any) -> list[Any]:
    """Submit `operations` as one group through a GroupWriter run for the occasion; the group's results."""
    writer = GroupWriter(store)
    async with anyio.create_task_group() as tg:
        await tg.start(writer.run)
        results = await submitted(writer, *operations)
        tg.cancel_scope.cancel()
    return results
