"""Typed write operations: what one group commit is made of.

A write handed to the GroupWriter is a tuple of operations that must commit
together (an agent's speech row and its outbox row; a peer message and its
queue entry). Each operation type applies every one of its instances in a
group with one call of its own repository (`apply_all`), so a group of a
thousand small writes is still a few `executemany`-sized statements, and the
writer itself holds no SQL and knows no table.

Types run in `STAGE` order inside the group's transaction (a later stage may
rely on rows an earlier one stored), then in order of first appearance.
Adding an operation is a class here and a repository method; the writer
does not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import msgspec

from mcplhost.store.interfaces import Repositories
from mcplhost.store.items import ItemWritten, NewItem
from mcplhost.store.pushes import PushClaim

#: Stage of operations that store rows others may refer to.
STAGE_ROWS = 10


class Operation(Protocol):
    """One typed write; `apply_all` stores every instance of the type in a group, results in order."""

    STAGE: ClassVar[int]

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[Any]) -> list[Any]: ...


class InsertItems(msgspec.Struct, frozen=True):
    """Store items; the result is one `ItemWritten` per item (a repeated channel item is its original)."""

    items: list[NewItem]
    STAGE: ClassVar[int] = STAGE_ROWS

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[InsertItems]) -> list[list[ItemWritten]]:
        written = await repos.items.insert_many_nocommit([item for op in ops for item in op.items])
        results, start = [], 0
        for op in ops:
            results.append(written[start : start + len(op.items)])
            start += len(op.items)
        return results


class PushWritten(msgspec.Struct, frozen=True):
    """What storing a push came to: the answer (JSON) to give, its item's id, and whether it was a repeat."""

    answer: bytes
    item_id: int  # 0 only for a repeat of a record from before migration 0002, whose item is unknown
    duplicate: bool


class ClaimPush(msgspec.Struct, frozen=True):
    """Store a push's item once per (server, event id); the result is a `PushWritten`."""

    claim: PushClaim
    item: NewItem
    STAGE: ClassVar[int] = STAGE_ROWS

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[ClaimPush]) -> list[PushWritten]:
        outcomes = await repos.pushes.claim_many([op.claim for op in ops])
        winners = [op for op, outcome in zip(ops, outcomes) if outcome.claimed]
        written = await repos.items.insert_many_nocommit([op.item for op in winners])
        item_of = {(op.claim.server_id, op.claim.event_id): w.id for op, w in zip(winners, written)}
        await repos.pushes.attach_items_nocommit([(*key, item_id) for key, item_id in item_of.items()])
        results = []
        for op, outcome in zip(ops, outcomes):
            key = (op.claim.server_id, op.claim.event_id)
            # A repeat of an event claimed earlier in this group takes the item just stored.
            item_id = outcome.item_id if outcome.item_id is not None else item_of.get(key, 0)
            results.append(PushWritten(outcome.answer, item_id, not outcome.claimed))
        return results
