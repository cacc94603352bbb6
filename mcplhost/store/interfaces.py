"""The store as the rest of mcplhost sees it: repository Protocols, no engine in sight.

Everything above store/ (the group writer's operations, Ingest, the CLI's
readers) needs only these shapes, so a PostgreSQL store would be new classes
behind the same Protocols, not a rewrite
(docs/architecture.md#where-the-next-layers-attach). The rules they promise, whatever the engine:

- ids come from the database (`RETURNING`), never computed by a caller;
- a repeated channel item and a repeated push event are conflicts the schema
  detects (`ON CONFLICT DO NOTHING`), reported back, never stored twice;
- `*_nocommit` methods run inside the caller's `transaction()`, so one
  transaction can span repositories.

SQLite (db.py, items.py, pushes.py, turns.py, cursors.py, outbox.py) is the only implementation.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from mcplhost.store.cursors import CursorMove
from mcplhost.store.items import ItemWritten, NewItem, StoredItem
from mcplhost.store.outbox import OutboxEntry, OutboxRow, PendingPublish
from mcplhost.store.pushes import ClaimOutcome, PushClaim
from mcplhost.store.turns import Turn, TurnEnd, TurnStart


class Items(Protocol):
    """Stored items: insert (idempotent for channel items) and read."""

    async def insert_many(self, items: Sequence[NewItem]) -> builtins.list[int]: ...

    async def insert_many_nocommit(self, items: Sequence[NewItem]) -> builtins.list[ItemWritten]: ...

    async def thread_of(self, server_id: str, channel_id: str, message_id: str) -> str | None: ...

    async def list(self, *, limit: int | None = None, channel: str | None = None,
                   agent: str | None = None) -> builtins.list[StoredItem]: ...

    def iterate(self, *, limit: int | None = None, channel: str | None = None,
                agent: str | None = None) -> AsyncIterator[StoredItem]: ...

    async def last_id(self) -> int: ...

    async def after(self, item_id: int, *, since_ms: int = 0,
                    limit: int | None = None) -> builtins.list[StoredItem]: ...

    async def after_as_written(self, item_id: int, *, since_ms: int = 0,
                               limit: int | None = None) -> builtins.list[tuple[int, NewItem]]: ...

    async def context_rows(self, agent: str, *, limit: int,
                           conversation_id: str | None = None) -> builtins.list[StoredItem]: ...

    async def get_many(self, ids: Sequence[int]) -> builtins.list[StoredItem]: ...


class Pushes(Protocol):
    """Push-event dedup: one claim per (server, event id), with the item it stored."""

    async def get(self, server_id: str, event_id: str) -> bytes | None: ...

    async def claim_many(self, claims: Sequence[PushClaim]) -> builtins.list[ClaimOutcome]: ...

    async def attach_items_nocommit(self, attachments: Sequence[tuple[str, str, int]]) -> None: ...

    async def prune(self, older_than_ms: int) -> int: ...


class Turns(Protocol):
    """The turns ledger: a turn begun, ended once, and read back (also for the spend guards)."""

    async def begin_many_nocommit(self, starts: Sequence[TurnStart]) -> builtins.list[int]: ...

    async def finish_many_nocommit(self, ends: Sequence[TurnEnd]) -> builtins.list[bool]: ...

    async def close_unfinished_nocommit(self, ended_at: int, outcome: str = "aborted") -> int: ...

    async def get(self, turn_id: int) -> Turn | None: ...

    async def injections(self, turn_id: int) -> Any: ...

    async def list(self, *, agent: str | None = None, limit: int | None = None) -> builtins.list[Turn]: ...

    def iterate(self, *, agent: str | None = None, limit: int | None = None) -> AsyncIterator[Turn]: ...

    async def usage_since(self, agent: str, since_ms: int) -> int: ...

    async def count_since(self, agent: str, since_ms: int) -> int: ...

    async def started_since(self, agent: str, since_ms: int, *,
                            limit: int | None = None) -> builtins.list[int]: ...


class Cursors(Protocol):
    """Agents' durable cursors: forward only, started at the store's end."""

    async def set_many_nocommit(self, moves: Sequence[CursorMove]) -> None: ...

    async def start_many_nocommit(self, agents: Sequence[tuple[str, int]]) -> builtins.list[int]: ...

    async def get(self, agent: str) -> int | None: ...

    async def all(self) -> dict[str, int]: ...


class Outbox(Protocol):
    """The publish outbox: rows queued with their speech, tried, and ended once (docs/agents.md#outbox)."""

    async def insert_many_nocommit(self, entries: Sequence[OutboxEntry]) -> builtins.list[int]: ...

    async def attempt_many_nocommit(self, attempts: Sequence[tuple[int, int, int, str]]) -> None: ...

    async def end_many_nocommit(self, ends: Sequence[tuple[int, str, int, str | None, str | None, bool]],
                                ) -> builtins.list[bool]: ...

    async def pending(self, server_id: str, *, limit: int) -> builtins.list[PendingPublish]: ...

    async def get(self, outbox_id: int) -> OutboxRow | None: ...

    async def count(self, state: str = "pending") -> int: ...

    def iterate(self, *, state: str | None = None) -> AsyncIterator[OutboxRow]: ...

    def remember_delivered(self, server_id: str, channel_id: str, message_id: str | None, outbox_id: int, *,
                           agent: str | None = None, text: str | None = None) -> None: ...

    def recent_delivered(self, server_id: str, channel_id: str, message_id: str) -> int | None: ...

    def recent_speaker(self, text: str) -> str | None: ...

    async def load_recent_delivered(self, now_ms: int) -> int: ...


class Repositories(Protocol):
    """An open store: its repositories and one transaction across them."""

    @property
    def items(self) -> Items: ...

    @property
    def pushes(self) -> Pushes: ...

    @property
    def turns(self) -> Turns: ...

    @property
    def cursors(self) -> Cursors: ...

    @property
    def outbox(self) -> Outbox: ...

    def transaction(self) -> AbstractAsyncContextManager[None]: ...
