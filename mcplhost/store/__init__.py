"""Storage on SQLite or PostgreSQL (store/open.py): one writer, readers beside it, numbered migrations, narrow
repositories.

    async with open_store(config.store.path, synchronous=config.store.synchronous) as store:
        ids = await store.items.insert_many(items)   # a repeated channel item: its original's id
        rows = await store.items.context_rows("scout", limit=50)   # store.reader's: no writer's lock

    async with open_reader(path) as store:          # CLI readers, read-only
        for item in await store.items.list(limit=20):
            print(export_line(item).decode())
"""

from mcplhost.store.composed import Store
from mcplhost.store.cursors import CursorMove, CursorRepository
from mcplhost.store.db import (
    BUSY_TIMEOUT_MS,
    DEFAULT_SYNCHRONOUS,
    READER_CONNECTIONS,
    SYNCHRONOUS_LEVELS,
    StoreReader,
    SynchronousLevel,
    apply_pragmas,
    connect_read_only,
)
from mcplhost.store.decisions import DECISION_REASONS, DecisionRepository, WakeDecision
from mcplhost.store.errors import (
    BrokenMigration,
    ForeignDatabase,
    SchemaBehind,
    SchemaTooNew,
    StoreError,
    StoreMissing,
)
from mcplhost.store.interfaces import Cursors, Items, Peers, Pushes, Quotas, Repositories, Turns
from mcplhost.store.items import (
    ItemRepository,
    ItemRow,
    ItemWritten,
    NewItem,
    StoredItem,
    export_line,
    item_row,
    row_content,
)
from mcplhost.store.open import DEFAULT_POOL_SIZE, is_database_url, open_reader, open_store, redacted_url
from mcplhost.store.peers import (
    DISPATCHES,
    RELATIONSHIPS,
    STATUSES,
    PeerEntry,
    PeerRelationship,
    PeerRepository,
    PeerRow,
    PeerSend,
    QueuedPeerMessage,
)
from mcplhost.store.pushes import PUSH_DEDUP_WINDOW_MS, ClaimOutcome, PushClaim, PushRepository
from mcplhost.store.quotas import (
    QUOTA_BUCKET_MS,
    QUOTA_WINDOW_BUCKETS,
    QUOTA_WINDOW_MS,
    QuotaCharge,
    QuotaRepository,
    QuotaUsage,
    body_bytes,
    bucket_of,
)
from mcplhost.store.stored import Stored, now_ms
from mcplhost.store.turns import OUTCOMES, Turn, TurnEnd, TurnRepository, TurnStart, turn_line

__all__ = [
    "DECISION_REASONS",
    "DEFAULT_POOL_SIZE",
    "DecisionRepository",
    "WakeDecision",
    "BUSY_TIMEOUT_MS",
    "DEFAULT_SYNCHRONOUS",
    "DISPATCHES",
    "OUTCOMES",
    "PUSH_DEDUP_WINDOW_MS",
    "QUOTA_BUCKET_MS",
    "QUOTA_WINDOW_BUCKETS",
    "QUOTA_WINDOW_MS",
    "READER_CONNECTIONS",
    "RELATIONSHIPS",
    "PeerRelationship",
    "STATUSES",
    "SYNCHRONOUS_LEVELS",
    "SynchronousLevel",
    "BrokenMigration",
    "ClaimOutcome",
    "CursorMove",
    "CursorRepository",
    "Cursors",
    "ForeignDatabase",
    "ItemRepository",
    "ItemRow",
    "ItemWritten",
    "Items",
    "NewItem",
    "PeerEntry",
    "PeerRepository",
    "PeerRow",
    "PeerSend",
    "Peers",
    "PushClaim",
    "PushRepository",
    "Pushes",
    "QueuedPeerMessage",
    "QuotaCharge",
    "QuotaRepository",
    "QuotaUsage",
    "Quotas",
    "Repositories",
    "SchemaBehind",
    "SchemaTooNew",
    "Store",
    "StoreError",
    "StoreMissing",
    "StoreReader",
    "Stored",
    "StoredItem",
    "Turn",
    "TurnEnd",
    "TurnRepository",
    "TurnStart",
    "Turns",
    "apply_pragmas",
    "body_bytes",
    "bucket_of",
    "connect_read_only",
    "export_line",
    "is_database_url",
    "item_row",
    "now_ms",
    "row_content",
    "open_reader",
    "open_store",
    "redacted_url",
    "turn_line",
]
