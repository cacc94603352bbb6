"""The advisory-lock keys PostgreSQL stores share, and why items take the order lock (docs/architecture.md#the-store).

Ids visible in order: an `items` id comes from a sequence when the row is inserted,
not when it commits, so with two writers (two hosts on one database) host B's id 101
could commit while host A's id 100 is still open; a reader of `id > cursor` (an
agent's cursor, `messages --follow`, the search indexer's mark, a new cursor's
`max(id)`) would pass 100 for good. So every transaction that inserts items first
takes ITEMS_ORDER_KEY (`pg_advisory_xact_lock`, held to its COMMIT or ROLLBACK).
Ids are taken only under the lock and the sequence only rises, so if T took M < N
and U took N, T held the lock first and released it only at its end, after its
commit was visible (PostgreSQL releases locks after making the commit visible): a
snapshot that sees N sees every committed id below it, and an id below N it does
not see was rolled back and never appears. Readers change nothing.

Other hosts learn of new items by NOTIFY on ITEMS_CHANNEL, sent inside each
item-storing transaction (so at its COMMIT, never for a rollback) with the newest
id as payload; a listener only takes it as a nudge to read `id > its mark`, and
polls too, so a notification lost (a listener reconnecting, a full queue) delays
a read, never loses an item (docs/architecture.md#engines).

The cost: item-storing commits of all writers run one at a time from their first
insert to their COMMIT (SQLite's single writer does the same for every commit).
"""

from __future__ import annotations

import hashlib

#: pg_advisory_xact_lock key taken before inserting items (64-bit, fixed: the same in every mcplhost process).
ITEMS_ORDER_KEY = 0x6D63_706C_0001  # "mcpl" 1
#: The NOTIFY channel an item-storing commit announces its newest id on.
ITEMS_CHANNEL = "mcplhost_items"
#: pg_advisory_xact_lock key each migration step takes, so two processes migrating apply a step once.
MIGRATION_KEY = 0x6D63_706C_0002  # "mcpl" 2


def ownership_key(kind: str, name: str) -> int:
    """The session-level advisory-lock key a host holds while it runs the connector or agent `name` (`kind`:
    "connector" or "agent"; docs/operations.md#several-hosts-on-one-store).

    64 bits of BLAKE2b over the kind and the name, as a signed bigint: the same in every process, and a collision
    with the fixed keys above or between two names is as likely as guessing a 64-bit hash.
    """
    digest = hashlib.blake2b(f"mcplhost:{kind}:{name}".encode(), digest_size=8, person=b"mcplhost-own").digest()
    return int.from_bytes(digest, "big", signed=True)
