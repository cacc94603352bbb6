"""Each agent's durable cursor: a low-water mark of the items it handled (docs/agents.md#the-durable-cursor).

The cursor is the highest item id such that every item at or below it that
wakes the agent was handled (its turn ended) or wakes nobody; the scheduler
decides it (`AgentScheduler.handled_through`), this module only stores it.
On start the host wakes an agent once for the matching items after its
cursor, so a host killed at any moment loses no wake. A cursor only moves
forward: a late or repeated write of an older position never makes an agent
handle items again.

An agent seen for the first time starts at the current end of the store,
written at once (`start_many_nocommit`), in the same transaction that reads
the end, so no item committed in between is skipped or handled twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from mcplhost.store.connection import Conn, Connections


class CursorMove(msgspec.Struct, frozen=True):
    """Set an agent's cursor to `item_id` (never backwards)."""

    agent: str
    item_id: int
    at: int  # epoch ms

    def __post_init__(self) -> None:
        if not self.agent:
            raise ValueError("a cursor needs its agent's name")
        if self.item_id < 0:
            raise ValueError(f"a cursor is an item id from 0, not {self.item_id}")


class CursorRepository:
    """Read and move agents' cursors; the only code that knows the agent_cursors table."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def set_many_nocommit(self, moves: Sequence[CursorMove]) -> None:
        """Move each agent's cursor forward to its `item_id`, inside the caller's transaction.

        A cursor already at or past the position stays where it is.
        """
        conn = self._connections.writer("cursors.set_many_nocommit")
        if moves:
            await conn.executemany(
                "INSERT INTO agent_cursors (agent, item_id, updated_at) VALUES (?, ?, ?)"
                " ON CONFLICT (agent) DO UPDATE SET item_id = CASE WHEN excluded.item_id > agent_cursors.item_id"
                " THEN excluded.item_id ELSE agent_cursors.item_id END,"
                " updated_at = excluded.updated_at",
                [(m.agent, m.item_id, m.at) for m in moves],
            )

    async def start_many_nocommit(self, agents: Sequence[tuple[str, int]]) -> list[int]:
        """Give each (agent, at) without a cursor one at the store's current end; every agent's cursor, in order."""
        conn = self._connections.writer("cursors.start_many_nocommit")
        if agents:
            await conn.executemany(
                "INSERT INTO agent_cursors (agent, item_id, updated_at)"
                " SELECT CAST(? AS TEXT), coalesce(max(id), 0), CAST(? AS BIGINT) FROM items WHERE TRUE"
                " ON CONFLICT (agent) DO NOTHING",
                list(agents),
            )
        return [await _get(conn, agent) or 0 for agent, _ in agents]

    async def get(self, agent: str) -> int | None:
        """The agent's cursor, or None when it has none yet (an agent never seen)."""
        async with self._connections.read() as conn:
            return await _get(conn, agent)

    async def all(self) -> dict[str, int]:
        """Every agent's cursor, by agent name."""
        async with self._connections.read() as conn:
            rows = await conn.fetch("SELECT agent, item_id FROM agent_cursors")
        return {agent: item_id for agent, item_id in rows}


async def _get(conn: Conn, agent: str) -> int | None:
    rows = await conn.fetch("SELECT item_id FROM agent_cursors WHERE agent = ?", (agent,))
    return next((row[0] for row in rows), None)
