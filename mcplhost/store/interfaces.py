"""The store as the rest of mcplhost sees it: repository Protocols, no engine in sight.

Everything above store/ (the group writer's operations, Ingest, the CLI's
readers) needs only these shapes, so a PostgreSQL store would be new classes
behind the same Protocols, not a rewrite
(docs/architecture.md#where-agents-speech-and-peers-attach). The rules they promise, whatever the engine:

- ids come from the database (`RETURNING`), never computed by a caller;
- a repeated channel item and a repeated push event are conflicts the schema
  detects (`ON CONFLICT DO NOTHING`), reported back, never stored twice;
- `*_nocommit` methods run inside the caller's `transaction()`, so one
  transaction can span repositories.

SQLite (db.py, items.py, pushes.py, turns.py, cursors.py, outbox.py, peers.py, quotas.py, decisions.py,
search_index.py, search_reader.py) is the only implementation.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from mcplhost.store.cursors import CursorMove
from mcplhost.store.decisions import WakeDecision
from mcplhost.store.items import ItemRow, ItemWritten, NewItem, StoredItem
from mcplhost.store.outbox import OutboxEntry, OutboxRow, PendingPublish
from mcplhost.store.peers import PeerEntry, PeerRow, PeerSend, QueuedPeerMessage, TargetCounts
from mcplhost.store.pushes import ClaimOutcome, PushClaim
from mcplhost.store.quotas import QuotaCharge, QuotaUsage
from mcplhost.store.search_query import IndexProgress, Required, SearchFilter
from mcplhost.store.turns import OutcomeCounts, Turn, TurnEnd, TurnStart


class Items(Protocol):
    """Stored items: insert (idempotent for channel items) and read."""

    async def insert_many(self, items: Sequence[NewItem]) -> builtins.list[int]: ...

    async def insert_many_nocommit(self, items: Sequence[NewItem], *, rows: Sequence[ItemRow] | None = None,
                                   searched: object = None) -> builtins.list[ItemWritten]: ...

    async def is_stored(self, server_id: str, channel_id: str, message_id: str, dedup_digest: str) -> bool: ...

    async def thread_of(self, server_id: str, channel_id: str, message_id: str) -> str | None: ...

    async def list(self, *, limit: int | None = None, channel: str | None = None,
                   agent: str | None = None) -> builtins.list[StoredItem]: ...

    def iterate(self, *, limit: int | None = None, channel: str | None = None, agent: str | None = None,
                since_ms: int | None = None, after_id: int = 0) -> AsyncIterator[StoredItem]: ...

    async def last_id(self) -> int: ...

    async def after(self, item_id: int, *, since_ms: int = 0,
                    limit: int | None = None) -> builtins.list[StoredItem]: ...

    async def after_as_written(self, item_id: int, *, since_ms: int = 0,
                               limit: int | None = None) -> builtins.list[tuple[int, NewItem]]: ...

    async def context_rows(self, agent: str, *, limit: int,
                           conversation_id: str | None = None) -> builtins.list[StoredItem]: ...

    async def own_after(self, agent: str, item_id: int, *, limit: int) -> builtins.list[StoredItem]: ...

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

    async def close_unfinished_nocommit(self, ended_at: int, outcome: str = "aborted", *,
                                        agents: Sequence[str] | None = None) -> int: ...

    async def get(self, turn_id: int) -> Turn | None: ...

    async def injections(self, turn_id: int) -> Any: ...

    async def list(self, *, agent: str | None = None, limit: int | None = None) -> builtins.list[Turn]: ...

    def iterate(self, *, agent: str | None = None, limit: int | None = None) -> AsyncIterator[Turn]: ...

    async def usage_since(self, agent: str, since_ms: int) -> int: ...

    async def count_since(self, agent: str, since_ms: int) -> int: ...

    async def started_since(self, agent: str, since_ms: int, *,
                            limit: int | None = None) -> builtins.list[int]: ...

    async def outcome_counts(self, after_id: int) -> OutcomeCounts: ...


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

    async def pending(self, server_id: str, *, limit: int, per_channel: int | None = None
                      ) -> builtins.list[PendingPublish]: ...

    async def fail_turn_pending_nocommit(self, turn_id: int, at: int, reason: str) -> builtins.list[int]: ...

    async def is_pending(self, outbox_id: int) -> bool: ...

    async def pending_connectors(self) -> builtins.list[str]: ...

    async def get(self, outbox_id: int) -> OutboxRow | None: ...

    async def count(self, state: str = "pending") -> int: ...

    def iterate(self, *, state: str | None = None) -> AsyncIterator[OutboxRow]: ...

    def remember_delivered(self, server_id: str, channel_id: str, message_id: str | None, outbox_id: int, *,
                           agent: str | None = None, text: str | None = None) -> None: ...

    def recent_delivered(self, server_id: str, channel_id: str, message_id: str) -> int | None: ...

    def recent_speaker(self, text: str) -> str | None: ...

    async def load_recent_delivered(self, now_ms: int) -> int: ...


class Peers(Protocol):
    """The durable peer queue: admitted messages, each delivered once, and the guards' seeds (docs/operations.md#the-peer-queue)."""

    async def insert_many_nocommit(self, entries: Sequence[PeerEntry]) -> builtins.list[int]: ...

    async def deliver_many_nocommit(self, deliveries: Sequence[tuple[int, int | None, int]],
                                    ) -> builtins.list[bool]: ...

    async def attach_items_nocommit(self, attachments: Sequence[tuple[int, int]]) -> None: ...

    async def queued(self, target: str, *, limit: int) -> builtins.list[QueuedPeerMessage]: ...

    async def queued_counts(self) -> dict[str, int]: ...

    async def queued_targets(self) -> builtins.list[str]: ...

    async def recent_sends(self, since_ms: int, *, limit: int) -> builtins.list[PeerSend]: ...

    async def to_target(self, target: str, since_ms: int, *, limit: int) -> TargetCounts: ...

    async def set_wake_counts_nocommit(self, counts: Sequence[tuple[str, int, int]]) -> None: ...

    async def wake_counts(self) -> dict[str, int]: ...

    async def get(self, entry_id: int) -> PeerRow | None: ...

    def iterate(self, *, target: str | None = None) -> AsyncIterator[PeerRow]: ...


class Quotas(Protocol):
    """Per-connector usage per minute bucket, written with the items it counts (docs/operations.md#quotas)."""

    async def add_many_nocommit(self, charges: Sequence[QuotaCharge]) -> None: ...

    async def usage_since(self, server_id: str, since_bucket: int) -> builtins.list[QuotaUsage]: ...


class Decisions(Protocol):
    """Stateful wake decisions kept for `mcplhost explain` (docs/agents.md#explain)."""

    async def record_many_nocommit(self, decisions: Sequence[WakeDecision]) -> None: ...

    async def for_item(self, item_id: int) -> builtins.list[WakeDecision]: ...


class SearchIndex(Protocol):
    """The index searches answer from, kept off the ack path (docs/operations.md#searching).

    An indexer follows the items by id and keeps a high-water mark: every item at or below it is
    indexed; `merge_step` tidies the index's structure a bounded step at a time (False: nothing left to do, as
    for an engine that keeps its index itself). SQLite's is FTS5 trigrams (search_index.py); a PostgreSQL
    store's would be pg_trgm, a second class.
    """

    #: Seconds its writes have held the writer while another writer waited, so far (the indexer paces itself by it).
    contended_s: float

    async def index_next(self, limit: int) -> int: ...

    async def merge_step(self) -> bool: ...

    async def forget_nocommit(self, ids: Sequence[int]) -> None: ...

    async def progress(self) -> IndexProgress: ...


class SearchReads(Protocol):
    """One search's reads, in its worker thread (search_reader.py): the items to test, newest first."""

    def newest_first(self, needs: Required | None, where: SearchFilter) -> Generator[StoredItem, None, None]: ...

    def close(self) -> None: ...


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

    @property
    def peers(self) -> Peers: ...

    @property
    def quotas(self) -> Quotas: ...

    @property
    def decisions(self) -> Decisions: ...

    @property
    def search_index(self) -> SearchIndex: ...

    def open_search_reads(self, interrupt: Callable[[], bool]) -> SearchReads: ...

    def transaction(self) -> AbstractAsyncContextManager[None]: ...
