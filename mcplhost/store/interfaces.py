"""The store as the rest of mcplhost sees it: repository Protocols, no engine in sight.

Everything above store/ (the group writer's operations, Ingest, the CLI's
readers) needs only these shapes, so a PostgreSQL store would be new classes
behind the same Protocols, not a rewrite (ARCHITECTURE.md, "Scale beyond one
machine"). The rules they promise, whatever the engine:

- ids come from the database (`RETURNING`), never computed by a caller;
- a repeated channel item and a repeated push event are conflicts the schema
  detects (`ON CONFLICT DO NOTHING`), reported back, never stored twice;
- `*_nocommit` methods run inside the caller's `transaction()`, so one
  transaction can span repositories.

SQLite (db.py, items.py, pushes.py) is the only implementation.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from mcplhost.store.items import ItemWritten, NewItem, StoredItem
from mcplhost.store.pushes import ClaimOutcome, PushClaim


class Items(Protocol):
    """Stored items: insert (idempotent for channel items) and read."""

    async def insert_many(self, items: Sequence[NewItem]) -> builtins.list[int]: ...

    async def insert_many_nocommit(self, items: Sequence[NewItem]) -> builtins.list[ItemWritten]: ...

    async def thread_of(self, server_id: str, channel_id: str, message_id: str) -> str | None: ...

    async def list(self, *, limit: int | None = None, channel: str | None = None,
                   agent: str | None = None) -> builtins.list[StoredItem]: ...

    def iterate(self, *, limit: int | None = None, channel: str | None = None,
                agent: str | None = None) -> AsyncIterator[StoredItem]: ...


class Pushes(Protocol):
    """Push-event dedup: one claim per (server, event id), with the item it stored."""

    async def get(self, server_id: str, event_id: str) -> bytes | None: ...

    async def claim_many(self, claims: Sequence[PushClaim]) -> builtins.list[ClaimOutcome]: ...

    async def attach_items_nocommit(self, attachments: Sequence[tuple[str, str, int]]) -> None: ...

    async def prune(self, older_than_ms: int) -> int: ...


class Repositories(Protocol):
    """An open store: its repositories and one transaction across them."""

    @property
    def items(self) -> Items: ...

    @property
    def pushes(self) -> Pushes: ...

    def transaction(self) -> AbstractAsyncContextManager[None]: ...
