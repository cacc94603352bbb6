"""Push-event dedup records: the first answer to each (server, event id), and the item it stored.

A connector may deliver the same `push/event` again (a retry after a lost
answer, a replay after a restart). The host claims the event, stores its
item and attaches the item's id in one transaction; a redelivery loses the
claim, gets the original answer and item id back, and stores nothing.

    async with store.transaction():
        claims = await store.pushes.claim_many([PushClaim(server, event_id, answer_json, now_ms)])
        if claims[0].claimed:
            (written,) = await store.items.insert_many_nocommit([item])
            await store.pushes.attach_items_nocommit([(server, event_id, written.id)])
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from mcplhost.store.connection import Conn, Connections

# A redelivery later than this after the first delivery is treated as a new event.
PUSH_DEDUP_WINDOW_MS = 24 * 60 * 60 * 1000

# Claims per INSERT statement (4 parameters each, far below SQLite's variable limit).
CLAIMS_PER_INSERT = 1024


class PushClaim(msgspec.Struct, frozen=True):
    """A push event about to be recorded with the answer it will get."""

    server_id: str
    event_id: str
    answer: bytes  # JSON
    created_at: int  # epoch ms


class ClaimOutcome(msgspec.Struct, frozen=True):
    """Whether a claim won; on a repeat, what the first delivery got."""

    claimed: bool  # True: the event is new, and this transaction records it
    answer: bytes  # the answer to give (JSON): this claim's, or the original's on a repeat
    item_id: int | None  # on a repeat, the original's item (None on records from before migration 0002)


class PushRepository:
    """Claim push events once, and look up the original answer and item of each."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def get(self, server_id: str, event_id: str) -> bytes | None:
        """The answer (JSON) first given to this event, or None if it was never recorded."""
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                "SELECT result FROM push_events WHERE server_id = ? AND event_id = ?",
                (server_id, event_id),
            )
        for (result,) in rows:
            answer: str = result
            return answer.encode()
        return None

    async def claim_many(self, claims: Sequence[PushClaim]) -> list[ClaimOutcome]:
        """Record each event not recorded yet, inside the caller's transaction; one outcome per claim, in order.

        The first claim of an event (already committed, or earlier in
        `claims`) wins; every later one gets the first one's answer and item.
        The winner's item id is set afterwards with `attach_items_nocommit`.
        """
        conn = self._connections.writer("pushes.claim_many")
        won: set[tuple[str, str]] = set()
        for start in range(0, len(claims), CLAIMS_PER_INSERT):
            chunk = claims[start : start + CLAIMS_PER_INSERT]
            returned = await conn.fetch(
                "INSERT INTO push_events (server_id, event_id, result, created_at) VALUES "
                + ", ".join(["(?, ?, ?, ?)"] * len(chunk))
                + " ON CONFLICT DO NOTHING RETURNING server_id, event_id",
                [v for c in chunk for v in (c.server_id, c.event_id, c.answer.decode(), c.created_at)],
            )
            won.update((server, event) for server, event in returned)
        outcomes: list[ClaimOutcome] = []
        first: dict[tuple[str, str], ClaimOutcome] = {}
        for claim in claims:
            key = (claim.server_id, claim.event_id)
            if key in first:  # a repeat inside this batch: answered like the first, item id set by the caller
                outcomes.append(ClaimOutcome(False, first[key].answer, first[key].item_id))
                continue
            first[key] = ClaimOutcome(True, claim.answer, None) if key in won else await _original(conn, *key)
            outcomes.append(first[key])
        return outcomes

    async def attach_items_nocommit(self, attachments: Sequence[tuple[str, str, int]]) -> None:
        """Set the item id of events claimed in this transaction: (server_id, event_id, item_id) each."""
        conn = self._connections.writer("pushes.attach_items_nocommit")
        if attachments:
            await conn.executemany(
                "UPDATE push_events SET item_id = ? WHERE server_id = ? AND event_id = ?",
                [(item_id, server, event) for server, event, item_id in attachments],
            )

    async def prune(self, older_than_ms: int) -> int:
        """Delete records created before the epoch-ms time `older_than_ms`; return how many.

        Callers pass `now_ms - PUSH_DEDUP_WINDOW_MS`.
        """
        async with self._connections.transaction():
            return await self._connections.writer("pushes.prune").execute(
                "DELETE FROM push_events WHERE created_at < ?", (older_than_ms,))


async def _original(conn: Conn, server_id: str, event_id: str) -> ClaimOutcome:
    """The answer and item the event's first claim recorded."""
    rows = await conn.fetch(
        "SELECT result, item_id FROM push_events WHERE server_id = ? AND event_id = ?", (server_id, event_id))
    ((result, item_id),) = rows
    return ClaimOutcome(False, result.encode(), item_id)
