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
from typing import Any, ClassVar, Protocol, TypeVar

import msgspec

from mcplhost.store.cursors import CursorMove
from mcplhost.store.decisions import WakeDecision
from mcplhost.store.interfaces import Repositories
from mcplhost.store.items import ItemRow, ItemWritten, NewItem, item_row
from mcplhost.store.outbox import OutboxEntry
from mcplhost.store.peers import PeerEntry, with_entry_id
from mcplhost.store.pushes import PushClaim
from mcplhost.store.quotas import QuotaCharge, bucket_of
from mcplhost.store.turns import TurnEnd, TurnStart

#: Stage of operations that store rows others may refer to.
STAGE_ROWS = 10
#: Stage of operations that record what was done with rows: a turn's end, an agent's cursor.
STAGE_LEDGER = 20


R_co = TypeVar("R_co", covariant=True)


class Operation(Protocol[R_co]):
    """One typed write whose result is an `R_co`; `apply_all` stores every instance of the type in a group, one
    result per instance, in order (store/writer.py hands each caller its own operations' results)."""

    STAGE: ClassVar[int]

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[Any]) -> Sequence[R_co]: ...


class InsertItems(msgspec.Struct, frozen=True):
    """Store items; the result is one `ItemWritten` per item (a repeated channel item is its original).

    `charged_to`: the connector whose quota counts these items (docs/operations.md#quotas), with
    `body_bytes` per item; each item really stored (not a repeat) is counted in the same transaction.
    `rows`, `searched`: the items' rows built already and the secrets version they were searched with
    (store/items.py `insert_many_nocommit`).
    """

    items: list[NewItem]
    charged_to: str | None = None
    body_bytes: list[int] | None = None
    rows: list[ItemRow] | None = None
    searched: object = None
    STAGE: ClassVar[int] = STAGE_ROWS

    def __post_init__(self) -> None:
        if self.charged_to is not None and (self.body_bytes is None or len(self.body_bytes) != len(self.items)):
            raise ValueError("items charged to a connector's quota need their body bytes, one per item")
        if self.rows is not None and len(self.rows) != len(self.items):
            raise ValueError("rows given for items must be one per item")

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[InsertItems]) -> list[list[ItemWritten]]:
        items = [item for op in ops for item in op.items]
        # Rows built by the callers pass on as they are, with their search when every op's was the same.
        searched = ops[0].searched if all(op.searched is ops[0].searched for op in ops) else None
        rows = [row for op in ops for row in (op.rows if op.rows is not None else map(item_row, op.items))]
        written = await repos.items.insert_many_nocommit(items, rows=rows, searched=searched)
        results: list[list[ItemWritten]] = []
        charges: list[QuotaCharge] = []
        start = 0
        for op in ops:
            own = written[start : start + len(op.items)]
            results.append(own)
            start += len(op.items)
            if op.charged_to is not None and op.body_bytes is not None:
                charges.extend(_charges(op.charged_to, op.items, op.body_bytes, own))
        await repos.quotas.add_many_nocommit(charges)
        return results


def _charges(server_id: str, items: list[NewItem], sizes: list[int], written: list[ItemWritten]) -> list[QuotaCharge]:
    """One charge per minute of the write for the items really stored (a request's items share their acceptance
    time, so it is almost always one)."""
    by_minute: dict[int, list[int]] = {}
    for item, size, w in zip(items, sizes, written, strict=True):
        if not w.duplicate:
            counts = by_minute.setdefault(bucket_of(item.created_at), [0, 0])
            counts[0] += 1
            counts[1] += size
    return [QuotaCharge(server_id, minute, count, size) for minute, (count, size) in by_minute.items()]


class PushWritten(msgspec.Struct, frozen=True):
    """What storing a push came to: the answer (JSON) to give, its item's id, and whether it was a repeat."""

    answer: bytes
    item_id: int  # 0 only for a repeat of a record from before migration 0002, whose item is unknown
    duplicate: bool


class ClaimPush(msgspec.Struct, frozen=True):
    """Store a push's item once per (server, event id); the result is a `PushWritten`.

    `body_bytes`: the item's, counted in its connector's quota (docs/operations.md#quotas) when it is
    stored (never for a repeat); None: not counted.
    """

    claim: PushClaim
    item: NewItem
    body_bytes: int | None = None
    STAGE: ClassVar[int] = STAGE_ROWS

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[ClaimPush]) -> list[PushWritten]:
        outcomes = await repos.pushes.claim_many([op.claim for op in ops])
        winners = [op for op, outcome in zip(ops, outcomes) if outcome.claimed]
        written = await repos.items.insert_many_nocommit([op.item for op in winners])
        item_of = {(op.claim.server_id, op.claim.event_id): w.id for op, w in zip(winners, written)}
        await repos.pushes.attach_items_nocommit([(*key, item_id) for key, item_id in item_of.items()])
        await repos.quotas.add_many_nocommit([QuotaCharge(op.claim.server_id, op.item.created_at, 1, op.body_bytes)
                                              for op in winners if op.body_bytes is not None])
        results = []
        for op, outcome in zip(ops, outcomes):
            key = (op.claim.server_id, op.claim.event_id)
            # A repeat of an event claimed earlier in this group takes the item just stored.
            item_id = outcome.item_id if outcome.item_id is not None else item_of.get(key, 0)
            results.append(PushWritten(outcome.answer, item_id, not outcome.claimed))
        return results


# --- agents: the turns ledger and the durable cursors (store/turns.py, store/cursors.py) ---------
# Each validates its values when built, in the caller's task, so a bad one never fails a group.


class BeginTurn(msgspec.Struct, frozen=True):
    """Record a turn as running; the result is its new turn id."""

    agent: str
    wake_item_ids: tuple[int, ...]
    started_at: int  # epoch ms
    STAGE: ClassVar[int] = STAGE_ROWS

    def __post_init__(self) -> None:
        TurnStart(self.agent, self.wake_item_ids, self.started_at)

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[BeginTurn]) -> list[int]:
        return await repos.turns.begin_many_nocommit([TurnStart(op.agent, op.wake_item_ids, op.started_at)
                                                      for op in ops])


class FinishTurn(msgspec.Struct, frozen=True):
    """End a running turn; the result is True, or False when the turn was unknown or already ended.

    `usage` is `msgspec.structs.asdict(model.Usage)` (or its camelCase form), summed over the turn's calls.
    """

    turn_id: int
    ended_at: int  # epoch ms
    outcome: str  # completed | failed | aborted | held
    model: str | None
    usage: dict[str, Any] | None
    request_digest: str | None
    #: The hook injections the first request was compiled with (e.g. msgspec.to_builtins(Injections)).
    injections: Any = None
    reason: str | None = None  # why it ended other than completed (store/turns.py REASON_*)
    cause: str | None = None  # a failed turn's finer cause (the backend's reason, or the exception's type name)
    STAGE: ClassVar[int] = STAGE_LEDGER

    def __post_init__(self) -> None:
        self._end(self.turn_id)

    def _end(self, turn_id: int) -> TurnEnd:
        return TurnEnd(turn_id, self.ended_at, self.outcome, self.model, self.usage, self.request_digest,
                       self.injections, self.reason, self.cause)

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[FinishTurn]) -> list[bool]:
        return await repos.turns.finish_many_nocommit([op._end(op.turn_id) for op in ops])


class RecordTurn(msgspec.Struct, frozen=True):
    """Record a turn begun and ended at once (e.g. a `held` wake); the result is its turn id."""

    agent: str
    wake_item_ids: tuple[int, ...]
    started_at: int
    ended_at: int
    outcome: str
    model: str | None = None
    usage: dict[str, Any] | None = None
    request_digest: str | None = None
    injections: Any = None
    reason: str | None = None
    STAGE: ClassVar[int] = STAGE_ROWS

    def __post_init__(self) -> None:
        TurnStart(self.agent, self.wake_item_ids, self.started_at)
        self._end(0)

    def _end(self, turn_id: int) -> TurnEnd:
        return TurnEnd(turn_id, self.ended_at, self.outcome, self.model, self.usage, self.request_digest,
                       self.injections, self.reason)

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[RecordTurn]) -> list[int]:
        ids = await repos.turns.begin_many_nocommit([TurnStart(op.agent, op.wake_item_ids, op.started_at)
                                                     for op in ops])
        await repos.turns.finish_many_nocommit([op._end(turn_id) for turn_id, op in zip(ids, ops, strict=True)])
        return ids


class CloseUnfinishedTurns(msgspec.Struct, frozen=True):
    """End every turn a killed host left running, as `aborted`; the result is how many.

    `agents`: only these agents' turns (a host sharing its store closes those of the agents it owns, never
    another live host's turn in progress); None: every agent's."""

    ended_at: int  # epoch ms
    agents: tuple[str, ...] | None = None
    STAGE: ClassVar[int] = STAGE_LEDGER

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[CloseUnfinishedTurns]) -> list[int]:
        return [await repos.turns.close_unfinished_nocommit(op.ended_at, agents=op.agents) for op in ops]


class SetCursor(msgspec.Struct, frozen=True):
    """Move an agent's durable cursor forward to `item_id` (never backwards); the result is None."""

    agent: str
    item_id: int
    at: int  # epoch ms
    STAGE: ClassVar[int] = STAGE_LEDGER

    def __post_init__(self) -> None:
        CursorMove(self.agent, self.item_id, self.at)

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[SetCursor]) -> list[None]:
        await repos.cursors.set_many_nocommit([CursorMove(op.agent, op.item_id, op.at) for op in ops])
        return [None] * len(ops)


class StartCursor(msgspec.Struct, frozen=True):
    """Give an agent seen for the first time a cursor at the store's current end; the result is its cursor.

    An agent that has one keeps it (the result is then its stored cursor). It
    runs after the group's rows, so items stored in the same group count as before the cursor.
    """

    agent: str
    at: int  # epoch ms
    STAGE: ClassVar[int] = STAGE_LEDGER

    def __post_init__(self) -> None:
        CursorMove(self.agent, 0, self.at)

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[StartCursor]) -> list[int]:
        return await repos.cursors.start_many_nocommit([(op.agent, op.at) for op in ops])


# --- speech: the publish outbox (store/outbox.py, docs/agents.md#outbox) ----------------------------------


class PublishedSpeech(msgspec.Struct, frozen=True):
    """What queuing a speech came to: the speech row's id and its outbox rows' ids, in order."""

    item_id: int
    outbox_ids: list[int]


class PublishSpeech(msgspec.Struct, frozen=True):
    """Queue publishes and store the speech row that caused them, in one transaction; the result is PublishedSpeech.

    The outbox rows are written first, then the speech row with `metadata.outboxId` (the first row's id;
    `outboxIds` lists them all when there are several) — so no speech row is stored without its publish.
    """

    speech: NewItem
    entries: list[OutboxEntry]
    STAGE: ClassVar[int] = STAGE_ROWS

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[PublishSpeech]) -> list[PublishedSpeech]:
        ids = await repos.outbox.insert_many_nocommit([entry for op in ops for entry in op.entries])
        rows, start = [], 0
        for op in ops:
            own = ids[start : start + len(op.entries)]
            start += len(op.entries)
            metadata = {**op.speech.metadata, "outboxId": own[0] if own else None}
            if len(own) > 1:
                metadata["outboxIds"] = own
            rows.append((msgspec.structs.replace(op.speech, metadata=metadata), own))
        written = await repos.items.insert_many_nocommit([row for row, _ in rows])
        return [PublishedSpeech(w.id, own) for w, (_, own) in zip(written, rows, strict=True)]


class RecordPublishAttempt(msgspec.Struct, frozen=True):
    """A try of a pending publish that failed but will be retried at `next_attempt_at`; the result is None."""

    outbox_id: int
    at: int  # epoch ms
    next_attempt_at: int  # epoch ms
    error: str
    STAGE: ClassVar[int] = STAGE_LEDGER

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[RecordPublishAttempt]) -> list[None]:
        await repos.outbox.attempt_many_nocommit([(op.outbox_id, op.at, op.next_attempt_at, op.error)
                                                  for op in ops])
        return [None] * len(ops)


class FailTurnPublishes(msgspec.Struct, frozen=True):
    """Fail, unsent, every pending outbox row of one turn (a stop aborted it); the result is the ids failed.

    One write for the whole turn, conditional on `pending`: a row already
    delivered stays delivered. No `failed-reply` notice: the stop was asked for.
    """

    turn_id: int
    at: int  # epoch ms
    reason: str  # the rows' error, e.g. store/turns.py REASON_STOPPED
    STAGE: ClassVar[int] = STAGE_LEDGER

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[FailTurnPublishes]) -> list[list[int]]:
        return [await repos.outbox.fail_turn_pending_nocommit(op.turn_id, op.at, op.reason) for op in ops]


class EndPublish(msgspec.Struct, frozen=True):
    """End a pending publish as delivered or failed (with its `failed-reply` notice); True when it was pending.

    `attempted`: this end follows a try (counted in `attempts`); False for a row failed unsent (too old).
    The notice is stored only when the row really ended here, so a repeated end writes no second notice.
    """

    outbox_id: int
    state: str  # delivered | failed
    at: int  # epoch ms
    message_id: str | None = None
    error: str | None = None
    attempted: bool = True
    notice: NewItem | None = None
    STAGE: ClassVar[int] = STAGE_LEDGER

    def __post_init__(self) -> None:
        if self.state not in ("delivered", "failed"):
            raise ValueError(f"a publish ends delivered or failed, not {self.state!r}")

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[EndPublish]) -> list[bool]:
        ended = await repos.outbox.end_many_nocommit(
            [(op.outbox_id, op.state, op.at, op.message_id, op.error, op.attempted) for op in ops])
        notices = [op.notice for op, done in zip(ops, ended, strict=True) if done and op.notice is not None]
        if notices:
            await repos.items.insert_many_nocommit(notices)
        return ended


# --- peers: the durable peer queue (store/peers.py, docs/operations.md#the-peer-queue) -------------


class PeerEnqueued(msgspec.Struct, frozen=True):
    """What storing an admitted peer message came to: its entry's id, and its row's when delivered at once."""

    entry_id: int
    item_id: int | None


class EnqueuePeerMessage(msgspec.Struct, frozen=True):
    """Store an admitted peer message; the result is a PeerEnqueued.

    Without `row` the entry stays queued (the target is busy). With `row`
    (the target is idle) it is delivered at once in the same transaction:
    the entry, then the row with `metadata.peerMessageId`, then the entry
    marked delivered with that row's id (at the entry's `created_at`).
    """

    entry: PeerEntry
    row: NewItem | None = None
    STAGE: ClassVar[int] = STAGE_ROWS

    def __post_init__(self) -> None:
        if self.row is not None:
            _checkwith_entry_id(self.row, self.entry.target)

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[EnqueuePeerMessage]) -> list[PeerEnqueued]:
        entry_ids = await repos.peers.insert_many_nocommit([op.entry for op in ops])
        at_once = [(entry_id, op.entry.created_at, with_entry_id(op.row, entry_id))
                   for entry_id, op in zip(entry_ids, ops, strict=True) if op.row is not None]
        written = await repos.items.insert_many_nocommit([row for _, _, row in at_once])
        item_of = {entry_id: w.id for (entry_id, _, _), w in zip(at_once, written, strict=True)}
        await repos.peers.deliver_many_nocommit([(entry_id, item_of[entry_id], at) for entry_id, at, _ in at_once])
        return [PeerEnqueued(entry_id, item_of.get(entry_id)) for entry_id in entry_ids]


class DeliverPeerMessages(msgspec.Struct, frozen=True):
    """Deliver queued entries, each as its own row; the result lists, per delivery, its row's id or None.

    Each entry is marked delivered first (only a queued entry is), and its
    row (with `metadata.peerMessageId`) is stored only when that mark
    succeeded, so an entry delivered twice, in one group or two, stores one
    row: the later delivery's result is None.
    """

    deliveries: list[tuple[int, NewItem]]  # (entry_id, the row to store for its target)
    at: int  # epoch ms
    STAGE: ClassVar[int] = STAGE_ROWS

    def __post_init__(self) -> None:
        for entry_id, row in self.deliveries:
            if entry_id < 1:
                raise ValueError(f"a peer message's id is a positive integer, not {entry_id!r}")
            _checkwith_entry_id(row, None)

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[DeliverPeerMessages]) -> list[list[int | None]]:
        marked = await repos.peers.deliver_many_nocommit([(entry_id, None, op.at) for op in ops
                                                          for entry_id, _ in op.deliveries])
        winners = [(entry_id, row) for (entry_id, row), won
                   in zip([d for op in ops for d in op.deliveries], marked, strict=True) if won]
        written = await repos.items.insert_many_nocommit([with_entry_id(row, entry_id) for entry_id, row in winners])
        item_of = {entry_id: w.id for (entry_id, _), w in zip(winners, written, strict=True)}
        await repos.peers.attach_items_nocommit(list(item_of.items()))
        results, won_iter = [], iter(marked)
        for op in ops:
            results.append([item_of[entry_id] if next(won_iter) else None for entry_id, _ in op.deliveries])
        return results


class SetPeerWakeCounts(msgspec.Struct, frozen=True):
    """Record agents' consecutive peer-started turns: (agent, consecutive, at); the result is None."""

    counts: list[tuple[str, int, int]]
    STAGE: ClassVar[int] = STAGE_LEDGER

    def __post_init__(self) -> None:
        for agent, consecutive, _ in self.counts:
            if not agent:
                raise ValueError("a peer wake count needs its agent's name")
            if consecutive < 0:
                raise ValueError(f"a peer wake count is a whole number from 0, not {consecutive!r}")

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[SetPeerWakeCounts]) -> list[None]:
        await repos.peers.set_wake_counts_nocommit([count for op in ops for count in op.counts])
        return [None] * len(ops)


class RecordWakeDecisions(msgspec.Struct, frozen=True):
    """Keep stateful wake decisions for `mcplhost explain` (store/decisions.py); the result is None."""

    decisions: list[WakeDecision]
    STAGE: ClassVar[int] = STAGE_LEDGER

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[RecordWakeDecisions]) -> list[None]:
        await repos.decisions.record_many_nocommit([d for op in ops for d in op.decisions])
        return [None] * len(ops)


def _checkwith_entry_id(row: NewItem, target: str | None) -> None:
    """A peer row belongs to its target (it is that agent's row, docs/provenance.md §6)."""
    if not row.agent:
        raise ValueError("a peer message's row belongs to its target agent; set its agent")
    if row.dedup_digest is not None:
        raise ValueError("a peer message's row is never a redelivery; it takes no dedup_digest")
    if target is not None and row.agent != target:
        raise ValueError(f"a peer message to {target!r} is stored as {target!r}'s row, not {row.agent!r}'s")
