"""The durable peer queue: entries queued or delivered at once, each delivered exactly once, the guards' seeds."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import anyio
import msgspec
import pytest

from mcplhost.store import PeerEntry, Store, open_store
from mcplhost.store.migrate import default_folder, load_migrations
from mcplhost.store.operations import DeliverPeerMessages, EnqueuePeerMessage, PeerEnqueued, SetPeerWakeCounts
from mcplhost.store.writer import GroupWriter

from .conftest import make_item, with_writer

T0 = 1_790_000_000_000


def key(text: str) -> str:
    return hashlib.sha256(text.strip().encode()).hexdigest()


def entry(text: str = "status?", *, sender: str = "scout", target: str = "writer", relationship: str = "sibling",
          status: str = "queued", at: int = T0) -> PeerEntry:
    return PeerEntry(sender, target, relationship, "tool-end", text, key(text), status, at)


def peer_row(text: str = "status?", *, target: str = "writer", sender: str = "scout"):
    item = make_item(text, server=None, channel=None, agent=target, participant=sender)
    return msgspec.structs.replace(item, metadata={"peer": {"from": sender, "relationship": "sibling"}})




async def enqueue(store: Store, *entries: PeerEntry) -> list[int]:
    results = await with_writer(store, *(EnqueuePeerMessage(e) for e in entries))
    return [r.entry_id for r in results]


async def rows_of(store: Store, entry_id: int) -> list:
    return [i for i in await store.items.list() if i.metadata.get("peerMessageId") == entry_id]


class TestEntry:
    @pytest.mark.parametrize(("field", "value", "named"), [
        ("sender", "", "sender"), ("target", "", "target"), ("relationship", "self", "relationship"),
        ("relationship", "parent", "relationship"), ("dispatch", "now", "dispatch"),
        ("status", "refused", "status"), ("status", "rate_limited", "status"),
        ("text_key", "A" * 64, "text_key"), ("text_key", "a" * 63, "text_key"), ("text_key", "", "text_key"),
        ("text_key", "g" * 64, "text_key"),
    ])
    def test_a_bad_field_is_refused_when_built(self, field, value, named):
        """An entry that could not be a stored peer message is a ValueError naming the field, never a failed group."""
        fields = msgspec.structs.asdict(entry())
        fields[field] = value
        with pytest.raises(ValueError, match=named):
            PeerEntry(**fields)

    def test_every_allowed_value_builds(self):
        for relationship in ("ancestor", "sibling", "descendant"):
            for dispatch in ("tool-end", "turn-end"):
                for status in ("accepted", "queued"):
                    PeerEntry("a", "b", relationship, dispatch, "t", key("t"), status, 0)


class TestEnqueue:
    async def test_without_a_row_the_entry_stays_queued_and_counts(self, store):
        """A message to a busy target is stored queued: counted, listed, and no item is stored."""
        (result,) = await with_writer(store, EnqueuePeerMessage(entry("one")))
        assert result == PeerEnqueued(result.entry_id, None)
        row = await store.peers.get(result.entry_id)
        assert (row.state, row.status, row.delivered_at, row.item_id) == ("queued", "queued", None, None)
        assert await store.peers.queued_counts() == {"writer": 1}
        assert await store.peers.queued_targets() == ["writer"]
        (queued,) = await store.peers.queued("writer", limit=10)
        assert (queued.id, queued.sender, queued.text, queued.dispatch) == (result.entry_id, "scout", "one", "tool-end")
        assert await store.items.list() == []

    async def test_with_a_row_it_is_delivered_at_once_and_the_row_names_it(self, store):
        """A message to an idle target is stored delivered, with its row carrying peerMessageId, in one commit."""
        row = peer_row("hello")
        (result,) = await with_writer(store, EnqueuePeerMessage(entry("hello", status="accepted"), row))
        (item,) = await store.items.list()
        assert result == PeerEnqueued(result.entry_id, item.id)
        assert item.metadata == {"peer": {"from": "scout", "relationship": "sibling"}, "peerMessageId": result.entry_id}
        assert item.agent == "writer" and "peerMessageId" not in row.metadata  # the caller's metadata is a copy
        stored = await store.peers.get(result.entry_id)
        assert (stored.state, stored.status, stored.item_id, stored.delivered_at) == ("delivered", "accepted",
                                                                                     item.id, T0)
        assert await store.peers.queued("writer", limit=10) == [] and await store.peers.queued_counts() == {}

    async def test_several_in_one_group_keep_their_order_and_their_rows(self, store):
        """Queued and delivered-at-once messages in one write each get their own entry; rows match entries."""
        results = await with_writer(store, EnqueuePeerMessage(entry("a")),
                                    EnqueuePeerMessage(entry("b", target="editor"), peer_row("b", target="editor")),
                                    EnqueuePeerMessage(entry("c")))
        assert [r.entry_id for r in results] == sorted(r.entry_id for r in results)
        assert results[0].item_id is None and results[2].item_id is None
        (item,) = await rows_of(store, results[1].entry_id)
        assert item.id == results[1].item_id and item.agent == "editor"
        assert [q.text for q in await store.peers.queued("writer", limit=10)] == ["a", "c"]

    async def test_a_failed_group_stores_neither_entry_nor_row(self, store):
        """When the transaction fails, no entry and no row exist: the sender was never answered."""
        with pytest.raises(sqlite3.Error):
            async with store.transaction():
                await EnqueuePeerMessage.apply_all(store, [EnqueuePeerMessage(entry(), peer_row())])
                raise sqlite3.OperationalError("forced")
        assert [r async for r in store.peers.iterate()] == [] and await store.items.list() == []

    def test_a_row_for_another_agent_is_refused_when_built(self):
        """The row is the target's own; a row for someone else, or for no agent, is a caller's bug."""
        with pytest.raises(ValueError, match="editor"):
            EnqueuePeerMessage(entry(target="writer"), peer_row(target="editor"))
        with pytest.raises(ValueError, match="agent"):
            EnqueuePeerMessage(entry(), msgspec.structs.replace(peer_row(), agent=None))
        with pytest.raises(ValueError, match="dedup_digest"):
            EnqueuePeerMessage(entry(), msgspec.structs.replace(peer_row(), dedup_digest="d" * 64))


class TestDeliver:
    async def test_a_queued_entry_is_delivered_as_its_own_row(self, store):
        """Delivery stores the row with peerMessageId and marks the entry delivered with that row and time."""
        (entry_id,) = await enqueue(store, entry("later"))
        row = peer_row("later")
        results = await with_writer(store, DeliverPeerMessages([(entry_id, row)], T0 + 50))
        (item,) = await store.items.list()
        assert results == [[item.id]] and item.metadata["peerMessageId"] == entry_id and "peerMessageId" not in row.metadata
        stored = await store.peers.get(entry_id)
        assert (stored.state, stored.delivered_at, stored.item_id) == ("delivered", T0 + 50, item.id)
        assert await store.peers.queued_targets() == [] and await store.peers.queued_counts() == {}

    async def test_twice_in_two_groups_stores_one_row(self, store):
        """A delivery repeated after its commit (a retry, a restart) is None and stores nothing."""
        (entry_id,) = await enqueue(store, entry())
        (first,) = await with_writer(store, DeliverPeerMessages([(entry_id, peer_row())], T0 + 1))
        (second,) = await with_writer(store, DeliverPeerMessages([(entry_id, peer_row())], T0 + 2))
        assert first[0] is not None and second == [None]
        assert len(await rows_of(store, entry_id)) == 1
        assert (await store.peers.get(entry_id)).delivered_at == T0 + 1

    async def test_twice_in_one_group_stores_one_row(self, store):
        """Two deliveries of an entry in one write, two ops or one, store one row: the first wins."""
        (a, b) = await enqueue(store, entry("a"), entry("b"))
        results = await with_writer(store, DeliverPeerMessages([(a, peer_row("a"))], T0 + 1),
                                    DeliverPeerMessages([(a, peer_row("a")), (b, peer_row("b")), (b, peer_row("b"))],
                                                        T0 + 2))
        (first,), (again, b_item, b_again) = results
        assert first is not None and again is None and b_item is not None and b_again is None
        assert len(await rows_of(store, a)) == 1 and len(await rows_of(store, b)) == 1
        assert (await store.peers.get(a)).item_id == first and (await store.peers.get(b)).item_id == b_item

    async def test_two_groups_at_once_store_one_row(self, store):
        """Deliveries of one entry racing in two writers' groups still store one row."""
        (entry_id,) = await enqueue(store, entry())
        writer = GroupWriter(store)
        results: list = []

        async def deliver() -> None:
            results.append(await writer.write(DeliverPeerMessages([(entry_id, peer_row())], T0 + 1)))

        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            async with anyio.create_task_group() as senders:
                for _ in range(4):
                    senders.start_soon(deliver)
            tg.cancel_scope.cancel()
        assert sorted(r[0] is None for r in results) == [False, True, True, True]
        assert len(await rows_of(store, entry_id)) == 1

    async def test_an_entry_delivered_at_once_is_not_delivered_again(self, store):
        """An accepted message (delivered when stored) is never delivered a second time."""
        (result,) = await with_writer(store, EnqueuePeerMessage(entry(status="accepted"), peer_row()))
        assert await with_writer(store, DeliverPeerMessages([(result.entry_id, peer_row())], T0 + 5)) == [[None]]
        assert len(await rows_of(store, result.entry_id)) == 1

    async def test_an_unknown_entry_stores_nothing(self, store):
        assert await with_writer(store, DeliverPeerMessages([(999, peer_row())], T0)) == [[None]]
        assert await store.items.list() == []

    def test_a_bad_delivery_is_refused_when_built(self):
        with pytest.raises(ValueError, match="positive"):
            DeliverPeerMessages([(0, peer_row())], T0)
        with pytest.raises(ValueError, match="agent"):
            DeliverPeerMessages([(1, msgspec.structs.replace(peer_row(), agent=None))], T0)


class TestReads:
    async def test_queued_is_the_targets_own_oldest_first_and_bounded(self, store):
        ids = await enqueue(store, entry("1"), entry("x", target="editor"), entry("2"), entry("3"))
        assert [q.id for q in await store.peers.queued("writer", limit=2)] == [ids[0], ids[2]]
        assert [q.text for q in await store.peers.queued("editor", limit=10)] == ["x"]
        assert await store.peers.queued("nobody", limit=10) == []

    async def test_a_negative_limit_is_refused_not_read_as_no_limit(self, store):
        """SQLite reads LIMIT -1 as unbounded; the repository refuses it instead of reading the whole table."""
        await enqueue(store, entry("1"), entry("2"))
        with pytest.raises(ValueError, match="limit"):
            await store.peers.queued("writer", limit=-1)
        with pytest.raises(ValueError, match="limit"):
            await store.peers.recent_sends(0, limit=-1)
        assert await store.peers.queued("writer", limit=0) == [] and await store.peers.recent_sends(0, limit=0) == []

    async def test_queued_counts_leave_guidance_out(self, store):
        """Guidance from an ancestor is queued but does not count toward the queue cap; its target still has mail."""
        await enqueue(store, entry("p"), entry("g", sender="lead", relationship="ancestor"),
                      entry("up", target="lead", relationship="descendant"),
                      entry("only guidance", target="editor", sender="lead", relationship="ancestor"))
        assert await store.peers.queued_counts() == {"writer": 1, "lead": 1}
        assert await store.peers.queued_targets() == ["editor", "lead", "writer"]
        assert len(await store.peers.queued("editor", limit=10)) == 1

    async def test_recent_sends_window_order_and_limit(self, store):
        """Admitted non-guidance sends since the cut, queued or delivered, oldest first; the newest when bounded."""
        ids = await enqueue(store, entry("old", at=T0 - 1), entry("edge", at=T0), entry("g", relationship="ancestor",
                                                                                          at=T0 + 1),
                            entry("late", at=T0 + 3, target="editor"), entry("mid", at=T0 + 2))
        await with_writer(store, DeliverPeerMessages([(ids[1], peer_row("edge"))], T0 + 4))
        sends = await store.peers.recent_sends(T0, limit=10)
        assert [(s.target, s.text_key, s.created_at) for s in sends] == [
            ("writer", key("edge"), T0), ("writer", key("mid"), T0 + 2), ("editor", key("late"), T0 + 3)]
        assert all(s.sender == "scout" for s in sends)
        assert [s.text_key for s in await store.peers.recent_sends(T0, limit=2)] == [key("mid"), key("late")]
        assert await store.peers.recent_sends(T0 + 4, limit=10) == []

    async def test_one_targets_counts_for_admission_across_hosts(self, store):
        """to_target: the target's own sends since the cut (guidance aside), its queue (guidance aside), its wakes."""
        ids = await enqueue(store, entry("old", at=T0 - 1), entry("edge", at=T0), entry("g", relationship="ancestor",
                                                                                          at=T0 + 1),
                            entry("other", at=T0 + 3, target="editor"), entry("mid", at=T0 + 2))
        await with_writer(store, DeliverPeerMessages([(ids[1], peer_row("edge"))], T0 + 4),
                          SetPeerWakeCounts([("writer", 2, T0)]))
        counts = await store.peers.to_target("writer", T0, limit=10)
        assert [(s.text_key, s.created_at) for s in counts.sends] == [(key("edge"), T0), (key("mid"), T0 + 2)]
        assert (counts.queued, counts.consecutive_wakes) == (2, 2)  # "old" and "mid"; the guidance is not counted
        fresh = await store.peers.to_target("nobody", T0, limit=10)
        assert (fresh.sends, fresh.queued, fresh.consecutive_wakes) == ([], 0, 0)

    async def test_iterate_and_get(self, store):
        ids = await enqueue(store, entry("a"), entry("b", target="editor"), entry("c"))
        assert [r.id for r in [r async for r in store.peers.iterate()]] == ids
        assert [r.text for r in [r async for r in store.peers.iterate(target="writer")]] == ["a", "c"]
        assert await store.peers.get(ids[-1] + 1) is None
        line = msgspec.json.decode(msgspec.json.encode(await store.peers.get(ids[0])))
        assert list(line) == ["id", "sender", "target", "relationship", "dispatch", "text", "status", "state",
                              "createdAt", "deliveredAt", "itemId"]


class TestWakeCounts:
    async def test_counts_are_upserted(self, store):
        """Each agent keeps its last count; a reset to 0 is kept as 0."""
        assert await store.peers.wake_counts() == {}
        await with_writer(store, SetPeerWakeCounts([("writer", 1, T0), ("editor", 2, T0)]))
        await with_writer(store, SetPeerWakeCounts([("writer", 2, T0 + 1)]), SetPeerWakeCounts([("editor", 0, T0 + 1)]))
        assert await store.peers.wake_counts() == {"writer": 2, "editor": 0}

    def test_a_bad_count_is_refused_when_built(self):
        with pytest.raises(ValueError, match="whole number"):
            SetPeerWakeCounts([("writer", -1, T0)])
        with pytest.raises(ValueError, match="name"):
            SetPeerWakeCounts([("", 1, T0)])


class TestDurable:
    async def test_a_queued_entry_and_the_counts_survive_closing_the_store(self, db_path: Path):
        """What was answered `queued` is still queued after the host stops, and is then delivered once."""
        async with open_store(db_path) as store:
            (entry_id,) = await enqueue(store, entry("kept"))
            await with_writer(store, SetPeerWakeCounts([("writer", 3, T0)]))
        async with open_store(db_path) as store:
            (queued,) = await store.peers.queued("writer", limit=10)
            assert (queued.id, queued.text) == (entry_id, "kept")
            assert await store.peers.wake_counts() == {"writer": 3}
            (delivered,) = await with_writer(store, DeliverPeerMessages([(entry_id, peer_row("kept"))], T0 + 9))
        async with open_store(db_path) as store:
            assert await store.peers.queued_targets() == [] and len(await rows_of(store, entry_id)) == 1
            assert await with_writer(store, DeliverPeerMessages([(entry_id, peer_row("kept"))], T0 + 10)) == [[None]]
            assert (await store.peers.get(entry_id)).item_id == delivered[0]


class TestMigration0006:
    async def test_a_version_5_database_gets_the_peer_tables(self, tmp_path: Path):
        """Migrating a database made by 0001-0005 adds the two peer tables and touches no item."""
        folder = tmp_path / "v5"
        folder.mkdir()
        for migration in load_migrations()[:5]:
            name = f"{migration.version:04d}_{migration.name}.sql"
            shutil.copy(Path(str(default_folder())) / name, folder / name)
        db = tmp_path / "old.db"
        async with open_store(db, migrations_folder=folder) as store:
            await store.items.insert_many([make_item("kept")])
        with sqlite3.connect(db) as conn:
            assert [v for (v,) in conn.execute("SELECT version FROM schema_version ORDER BY version")] == [1, 2, 3, 4, 5]
        conn.close()
        async with open_store(db) as store:
            assert [i.content[0]["text"] for i in await store.items.list()] == ["kept"]
            (entry_id,) = await enqueue(store, entry())
            assert [q.id for q in await store.peers.queued("writer", limit=1)] == [entry_id]
        with sqlite3.connect(db) as conn:
            versions = [v for (v,) in conn.execute("SELECT version FROM schema_version ORDER BY version")]
            names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}
        conn.close()
        assert versions[:6] == [1, 2, 3, 4, 5, 6] and versions == [m.version for m in load_migrations()]
        assert {"peer_messages", "peer_wake_counts", "peer_messages_queued", "peer_messages_by_time"} <= names

    async def test_the_queue_read_uses_its_partial_index(self, store, db_path: Path):
        """A target's queue is read through peer_messages_queued, not by walking the table."""
        with sqlite3.connect(db_path) as conn:
            plan = conn.execute("EXPLAIN QUERY PLAN SELECT id FROM peer_messages WHERE target = ? AND state = 'queued'"
                                " ORDER BY id LIMIT 10", ("writer",)).fetchall()
        conn.close()
        assert any("peer_messages_queued" in str(step) for step in plan)
