"""Push-event dedup records: the first answer to each (server, event id).

A connector may deliver the same `push/event` again (a retry after a lost
answer, a replay after a restart). The host stores the event's items and its
answer in one transaction; a redelivery finds the answer here and gets it
back unchanged, and nothing is stored twice.

    async with store.transaction():
        if (earlier := await store.pushes.get(server, event_id)) is not None:
            return earlier
        ids = await store.items.insert_many_nocommit(items)
        await store.pushes.record_nocommit(server, event_id, answer_json, now_ms)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mcplhost.store.errors import DuplicatePushEvent

if TYPE_CHECKING:
    from mcplhost.store.db import Database

# A redelivery later than this after the first delivery is treated as a new event.
PUSH_DEDUP_WINDOW_MS = 24 * 60 * 60 * 1000


class PushRepository:
    """Record and look up the original answer to each push event."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def get(self, server_id: str, event_id: str) -> bytes | None:
        """The answer (JSON) first given to this event, or None if it was never recorded."""
        async with self._database.reading():
            rows = await self._database.conn.execute_fetchall(
                "SELECT result FROM push_events WHERE server_id = ? AND event_id = ?",
                (server_id, event_id),
            )
        for (result,) in rows:
            return result.encode()
        return None

    async def record_nocommit(self, server_id: str, event_id: str, result_json: bytes, created_at: int) -> None:
        """Record an event's answer inside the caller's `store.transaction()`.

        Raises DuplicatePushEvent if the event already has one: the caller's
        transaction must then roll back, so its items are not stored twice.
        """
        await self.record_many_nocommit([(server_id, event_id, result_json, created_at)])

    async def record_many_nocommit(self, records: Sequence[tuple[str, str, bytes, int]]) -> None:
        """Record (server_id, event_id, result_json, created_at) rows inside the caller's transaction.

        The caller has checked each event is new (see GroupWriter); a
        duplicate raises DuplicatePushEvent and the transaction must roll back.
        """
        self._database.require_transaction("pushes.record_many_nocommit")
        if not records:
            return
        conn = self._database.conn
        before = conn.total_changes
        await conn.executemany(
            "INSERT INTO push_events (server_id, event_id, result, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (server_id, event_id) DO NOTHING",
            [(server, event, result.decode(), created_at) for server, event, result, created_at in records],
        )
        if conn.total_changes - before != len(records):
            raise DuplicatePushEvent(*records[0][:2])  # exact for one record; the batch's first otherwise

    async def prune(self, older_than_ms: int) -> int:
        """Delete records created before the epoch-ms time `older_than_ms`; return how many.

        Callers pass `now_ms - PUSH_DEDUP_WINDOW_MS`.
        """
        async with self._database.transaction():
            async with self._database.conn.execute(
                "DELETE FROM push_events WHERE created_at < ?", (older_than_ms,)
            ) as cursor:
                return cursor.rowcount
