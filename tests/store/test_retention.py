"""Retention (mcplhost/store/retention.py, docs/operations.md#retention): the pure rule, and each "never" on a real store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.config import Config, StoreConfig
from mcplhost.store import CursorMove, PeerEntry, PushClaim, Store, open_store
from mcplhost.store.operations import PublishSpeech
from mcplhost.store.outbox import OutboxEntry
from mcplhost.store.retention import DAY_MS, RETENTION_BATCH_ROWS, RetentionRow, outbox_ids, prunable
from mcplhost.store.writer import GroupWriter

from ..harness import wait_for
from ..memory_pair import memory_host
from ..properties import examples
from .conftest import make_item

NOW = 1_800_000_000_000
OLD = NOW - 10 * DAY_MS  # past a 7-day retention
RECENT = NOW - DAY_MS  # inside it


async def seed(store: Store, count: int, *, created_at: int = OLD, agent: str | None = None) -> list[int]:
    return await store.items.insert_many([make_item(f"item {n}", created_at=created_at, agent=agent)
                                          for n in range(count)])


async def ids(store: Store) -> list[int]:
    return [item.id for item in await store.items.list()]


async def prune(store: Store, *, agents: tuple[str, ...] | None = (), context_rows: int = 2000):
    return await store.retention.prune(retention_days=7, agents=agents, context_rows=context_rows, now_ms=NOW)


class TestRule:
    @settings(max_examples=examples(60), deadline=None)
    @given(ages=st.lists(st.booleans(), max_size=40), floor=st.integers(0, 45),
           protected=st.sets(st.integers(1, 40), max_size=10), kind=st.sampled_from(["outbox", "peer", "push"]))
    def test_deletes_exactly_the_old_unprotected_prefix(self, ages, floor, protected, kind) -> None:
        """Below the floor and before the first too-new item, every unneeded old row goes and every needed one stays."""
        rows = [RetentionRow(n, OLD if old else RECENT, (n + 1000,) if kind == "outbox" else ())
                for n, old in enumerate(ages, start=1)]
        sets = {"outbox": frozenset(p + 1000 for p in protected) if kind == "outbox" else frozenset(),
                "peer": frozenset(protected) if kind == "peer" else frozenset(),
                "push": frozenset(protected) if kind == "push" else frozenset()}
        decision = prunable(rows, cutoff_ms=NOW - 7 * DAY_MS, floor_id=floor, pending_outbox=sets["outbox"],
                            queued_peer_items=sets["peer"], claimed_items=sets["push"], after_id=0)
        stop = next((row.id for row in rows if row.id > floor or row.created_at >= NOW - 7 * DAY_MS), None)
        considered = [row.id for row in rows if stop is None or row.id < stop]
        assert decision.delete == [n for n in considered if n not in protected]
        assert getattr(decision.kept, kind) == len([n for n in considered if n in protected])
        assert decision.done == (stop is not None or not rows)
        assert decision.last_id == (considered[-1] if considered else 0)

    def test_outbox_ids_take_both_fields_and_ignore_junk(self) -> None:
        assert outbox_ids(3, "[3, 4]") == (3, 3, 4)
        assert outbox_ids(None, "not json") == ()
        assert outbox_ids("7", '["x"]') == ()


class TestNever:
    async def test_old_items_go_new_ones_stay(self, store: Store) -> None:
        old = await seed(store, 5)
        new = await seed(store, 3, created_at=RECENT)
        counts = await prune(store)
        assert counts.removed == 5
        assert await ids(store) == new
        assert old[-1] < new[0]

    async def test_never_the_newest_item(self, db_path: Path) -> None:
        """Else SQLite would give its id again, and a cursor past it would skip the next item."""
        async with open_store(db_path) as store:
            stored = await seed(store, 4)
            await prune(store)
            assert await ids(store) == stored[-1:]
            (again,) = await seed(store, 1, created_at=NOW)
        assert again == stored[-1] + 1

    async def test_never_above_an_agents_cursor(self, store: Store) -> None:
        stored = await seed(store, 10)
        async with store.transaction():
            await store.cursors.set_many_nocommit([CursorMove("scout", stored[3], NOW)])
        await prune(store, agents=("scout",), context_rows=1)
        assert await ids(store) == stored[4:]

    async def test_a_removed_agents_cursor_holds_nothing(self, store: Store) -> None:
        stored = await seed(store, 10)
        async with store.transaction():
            await store.cursors.set_many_nocommit([CursorMove("gone", stored[3], NOW)])
        await prune(store, agents=())
        assert await ids(store) == stored[-1:]

    async def test_on_a_shared_store_every_agents_cursor_holds_its_items(self, store: Store) -> None:
        """agents=None (several hosts: another host's agent is not in this host's config): every cursor counts."""
        stored = await seed(store, 10)
        async with store.transaction():
            await store.cursors.set_many_nocommit([CursorMove("elsewhere", stored[3], NOW),
                                                   CursorMove("scout", stored[6], NOW)])
        await prune(store, agents=None, context_rows=1)
        assert await ids(store) == stored[4:]

    async def test_never_an_agents_context(self, store: Store) -> None:
        """Each agent's newest context_rows rows it sees (everyone's and its own), not other agents' rows."""
        everyone = await seed(store, 6)
        own = await seed(store, 2, agent="scout")
        others = await seed(store, 3, agent="other")
        await prune(store, agents=("scout",), context_rows=4)
        # scout sees everyone's and its own: its newest 4 are everyone[4:] + own; the floor is below them.
        assert await ids(store) == everyone[4:] + own + others

    async def test_never_a_pending_publishs_speech_row(self, store: Store) -> None:
        entry = OutboxEntry(agent="scout", turn_id=None, server_id="disc", channel_id="disc:g1:a", thread_id=None,
                            conversation_id="c" * 64, text="hi", created_at=OLD)
        async with store.transaction():
            (published,) = await PublishSpeech.apply_all(store, [PublishSpeech(
                make_item("hi", agent="scout", role="assistant", created_at=OLD), [entry, entry])])
        await seed(store, 2)
        async with store.transaction():  # the first destination delivered, the second still pending
            await store.outbox.end_many_nocommit([(published.outbox_ids[0], "delivered", OLD, "m-1", None, True)])
        counts = await prune(store)
        assert published.item_id in await ids(store)
        assert counts.kept.outbox == 1
        async with store.transaction():
            await store.outbox.end_many_nocommit([(published.outbox_ids[1], "failed", OLD, None, "gone", True)])
        await prune(store)
        assert published.item_id not in await ids(store)

    async def test_never_an_item_a_queued_peer_entry_names(self, store: Store, db_path: Path) -> None:
        stored = await seed(store, 4)
        async with store.transaction():
            (entry,) = await store.peers.insert_many_nocommit([PeerEntry(
                "lead", "scout", "ancestor", "turn-end", "look", "a" * 64, "queued", OLD)])
        with sqlite3.connect(db_path) as raw:  # a queued entry naming an item: what the rule must honour
            raw.execute("UPDATE peer_messages SET item_id = ? WHERE id = ?", (stored[1], entry))
        counts = await prune(store)
        assert await ids(store) == [stored[1], stored[-1]]
        assert counts.kept.peer == 1

    async def test_never_a_push_claims_item_inside_its_window(self, store: Store) -> None:
        stored = await seed(store, 4)
        async with store.transaction():
            await store.pushes.claim_many([PushClaim("disc", "in-window", b"{}", NOW - 3600_000),
                                           PushClaim("disc", "expired", b"{}", NOW - 2 * DAY_MS)])
            await store.pushes.attach_items_nocommit([("disc", "in-window", stored[0]), ("disc", "expired", stored[1])])
        counts = await prune(store)
        assert await ids(store) == [stored[0], stored[-1]]
        assert counts.kept.push == 1

    async def test_inbound_commits_between_batches(self, store: Store) -> None:
        """A write queued during a long pass commits after the batch in progress, not after the pass."""
        await seed(store, RETENTION_BATCH_ROWS * 10)
        writer = GroupWriter(store)
        order: list[str] = []
        first_batch = anyio.Event()
        real_batch = store.retention.prune_batch

        async def batch(**kwargs):
            decision = await real_batch(**kwargs)
            order.append(f"batch deleted {len(decision.delete)}")
            first_batch.set()
            return decision

        store.retention.prune_batch = batch  # type: ignore[method-assign]  # to know when one batch committed

        async def pass_() -> None:
            await prune(store)
            order.append("pass")

        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            tg.start_soon(pass_)
            await first_batch.wait()
            await writer.store_items([make_item("live", created_at=NOW)])
            order.append("inbound")
            await wait_for(lambda: "pass" in order)
            tg.cancel_scope.cancel()
        after_inbound = order[order.index("inbound"):]
        assert any(step.startswith("batch deleted") and step != "batch deleted 0" for step in after_inbound), order
        assert order[-1] == "pass"


async def test_the_host_prunes_when_retention_days_is_set(tmp_path: Path) -> None:
    db = tmp_path / "host.db"
    async with open_store(db) as store:
        stored = await store.items.insert_many([make_item(f"old {n}", created_at=1_000) for n in range(5)])
    config = Config(store=StoreConfig(path=str(db), retention_days=1))  # type: ignore[arg-type]
    async with memory_host(config):
        await wait_for(lambda: count_items(db) == 1)
    assert [item_id for (item_id,) in read_ids(db)] == stored[-1:]


def read_ids(db: Path) -> list[tuple[int]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT id FROM items ORDER BY id").fetchall()


def count_items(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT count(*) FROM items").fetchone()[0]
