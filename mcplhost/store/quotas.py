"""Quota usage: per connector and minute, the items it stored and their body bytes (migration 0007).

The per-connector quotas (docs/operations.md#quotas) count a sliding hour
made of QUOTA_WINDOW_BUCKETS minute buckets. The counts are written in the
same transaction as the items they count (store/operations.py), so after a
crash or a restart they agree with what is stored; ingest keeps the hour in
memory and reads it from here once per connector, when it first hears from it.

Body bytes are the length of an item's stored content blocks as compact JSON
(what the `content` column holds): `body_bytes(content)`.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import msgspec

from mcplhost.store.connection import Connections

#: One bucket of the sliding hour: usage is counted per minute.
QUOTA_BUCKET_MS = 60_000
#: Buckets in the sliding hour (the current minute and the 59 before it).
QUOTA_WINDOW_BUCKETS = 60
#: The sliding hour's length.
QUOTA_WINDOW_MS = QUOTA_BUCKET_MS * QUOTA_WINDOW_BUCKETS

_encode = msgspec.json.encode


def bucket_of(at_ms: int) -> int:
    """The start (epoch ms) of the minute bucket holding `at_ms`."""
    return at_ms - at_ms % QUOTA_BUCKET_MS


def oldest_bucket(now_ms: int) -> int:
    """The start of the oldest bucket still inside the sliding hour that ends at `now_ms`."""
    return bucket_of(now_ms) - QUOTA_BUCKET_MS * (QUOTA_WINDOW_BUCKETS - 1)


def body_bytes(content: builtins.list[dict[str, Any]]) -> int:
    """The bytes a quota counts for an item: its content blocks as stored (compact JSON)."""
    return len(_encode(content))


class QuotaCharge(msgspec.Struct, frozen=True):
    """Usage to add: `items` stored by `server_id` in the bucket holding `at_ms`, of `body_bytes` in all."""

    server_id: str
    at_ms: int
    items: int
    body_bytes: int


class QuotaUsage(msgspec.Struct, frozen=True):
    """One stored bucket: what a connector stored in the minute starting at `bucket_start`."""

    bucket_start: int
    items: int
    body_bytes: int


class QuotaRepository:
    """Add to and read the per-minute usage; the only code that knows the quota_usage table."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections
        #: Per connector, the newest bucket its old rows were deleted for: deleted once a minute, not per write.
        self._pruned: dict[str, int] = {}

    async def add_many_nocommit(self, charges: Sequence[QuotaCharge]) -> None:
        """Add `charges` inside the caller's transaction, and drop each charged connector's buckets older than the hour."""
        if not charges:
            return
        summed: dict[tuple[str, int], list[int]] = {}
        for charge in charges:
            if charge.items < 0 or charge.body_bytes < 0:
                raise ValueError(f"a quota charge counts up, not {charge.items} items / {charge.body_bytes} bytes")
            counts = summed.setdefault((charge.server_id, bucket_of(charge.at_ms)), [0, 0])
            counts[0] += charge.items
            counts[1] += charge.body_bytes
        conn = self._connections.writer("quotas.add_many_nocommit")
        await conn.executemany(
            "INSERT INTO quota_usage (server_id, bucket_start, items, body_bytes) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (server_id, bucket_start) DO UPDATE SET"
            " items = quota_usage.items + excluded.items, body_bytes = quota_usage.body_bytes + excluded.body_bytes",
            [(server, bucket, items, size) for (server, bucket), (items, size) in summed.items()])
        newest: dict[str, int] = {}
        for server, bucket in summed:
            if bucket > self._pruned.get(server, -1):
                newest[server] = max(bucket, newest.get(server, bucket))
        if not newest:
            return
        await conn.executemany(  # the primary key's range: a few rows at most, once a minute
            "DELETE FROM quota_usage WHERE server_id = ? AND bucket_start < ?",
            [(server, oldest_bucket(bucket)) for server, bucket in newest.items()])
        # Should this transaction roll back, old rows stay until the next minute's delete: reads never count them.
        self._pruned.update(newest)

    async def usage_since(self, server_id: str, since_bucket: int) -> builtins.list[QuotaUsage]:
        """`server_id`'s buckets starting at or after `since_bucket`, oldest first."""
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                "SELECT bucket_start, items, body_bytes FROM quota_usage"
                " WHERE server_id = ? AND bucket_start >= ? ORDER BY bucket_start",
                (server_id, since_bucket))
        return [QuotaUsage(*row) for row in rows]
