"""The StoreReader: reads of items take read-only connections, never the writer's lock, and hold up no commit."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from mcplhost.store import CursorMove, PushClaim, Store, TurnEnd, TurnStart, open_store
from mcplhost.store.outbox import OutboxEntry

from ..builders import incoming, message, register
from ..harness import CHAT_GRANT, CHAT_MANIFEST, config_with, record
from ..harness import scripted as scripted_connector
from ..memory_pair import memory_host
from .conftest import make_item

ROOM = "disc:g1:room"
#: How long a read may take here while the writer's lock is held elsewhere; the old path waited forever.
READ_BOUND_S = 5.0


@asynccontextmanager
async def transaction_held(store: Store, write: Callable[[], Awaitable[object]]) -> AsyncIterator[None]:
    """Inside: another task has opened a transaction, made `write` in it, and holds the writer's lock."""
    held, release = anyio.Event(), anyio.Event()

    async def hold() -> None:
        async with store.transaction():
            await write()
            held.set()
            await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold)
        await held.wait()
        try:
            yield
        finally:
            release.set()


class TestReadsBesideTheWriter:
    async def test_item_reads_complete_while_another_task_holds_a_transaction_open(self, store: Store) -> None:
        """Context, catch-up, wake and export reads all answer while the writer's lock is taken and held."""
        (first,) = await store.items.insert_many([make_item("committed")])
        async with transaction_held(store, lambda: store.items.insert_many_nocommit([make_item("not yet committed")])):
            with anyio.fail_after(READ_BOUND_S):
                context = await store.items.context_rows("scout", limit=10)
                by_conversation = await store.items.context_rows("scout", limit=10, conversation_id="c-1")
                caught_up = await store.items.after_as_written(0)
                woken = await store.items.get_many([first, first + 1])
                last = await store.items.last_id()
                exported = [item async for item in store.items.iterate()]
                thread = await store.items.thread_of("discord", ROOM, "m-1")
        # Reads see the last commit only: the open transaction's row is not among them.
        assert [i.id for i in context] == [i.id for i in woken] == [i.id for i in exported] == [first]
        assert [i for i, _ in caught_up] == [first] and last == first
        assert by_conversation == [] and thread is None
        assert await store.items.last_id() == first + 1  # committed once released

    async def test_a_read_inside_a_transaction_sees_that_transactions_rows(self, store: Store) -> None:
        """The task's own transaction reads through the writer's connection, so its uncommitted rows are there."""
        async with store.transaction():
            (written,) = await store.items.insert_many_nocommit([make_item("mine")])
            assert [i.id for i in await store.items.get_many([written.id])] == [written.id]
            assert await store.items.last_id() == written.id

    async def test_reads_share_the_writers_lock_only_when_asked_to(self, db_path: Path) -> None:
        """reader_connections=0 is the old path (for benchmarks): no reader, reads wait for the transaction."""
        async with open_store(db_path, reader_connections=0) as store:
            assert store.reader is None
            async with transaction_held(store, lambda: anyio.sleep(0)):  # holds the lock, writes nothing
                with anyio.move_on_after(0.2) as waited:
                    await store.items.last_id()
            assert waited.cancelled_caught


class TestLedgerReadsBesideTheWriter:
    """The turns, outbox, cursor and push reads go through the reader too (docs/architecture.md#the-store)."""

    async def _committed_rows(self, store: Store) -> tuple[int, int]:
        """One finished turn, one delivered and one pending publish, a cursor and a push claim, committed."""
        async with store.transaction():
            (turn,) = await store.turns.begin_many_nocommit([TurnStart("scout", (1,), 1_000)])
            await store.turns.finish_many_nocommit([TurnEnd(turn, 2_000, "completed", injections=["x"],
                                                            usage={"input_tokens": 3, "output_tokens": 4})])
            delivered, pending = await store.outbox.insert_many_nocommit([publish("sent"), publish("waiting")])
            await store.outbox.end_many_nocommit([(delivered, "delivered", 3_000, "m-9", None, True)])
            await store.cursors.set_many_nocommit([CursorMove("scout", 5, 1_000)])
            await store.pushes.claim_many([PushClaim("discord", "e-1", b'{"accepted":true}', 1_000)])
        return turn, pending

    async def test_they_complete_while_another_task_holds_a_transaction_open(self, store: Store) -> None:
        """Each ledger read answers, from the last commit, while the writer's lock is taken and held."""
        turn, pending = await self._committed_rows(store)
        async def uncommitted() -> None:
            await store.cursors.set_many_nocommit([CursorMove("scout", 9, 2_000)])
            await store.outbox.insert_many_nocommit([publish("not yet committed")])

        async with transaction_held(store, uncommitted):
            with anyio.fail_after(READ_BOUND_S):
                read = {
                    "turn": (await store.turns.get(turn)).outcome,
                    "injections": await store.turns.injections(turn),
                    "turns": [t.id for t in await store.turns.list(agent="scout")],
                    "usage": await store.turns.usage_since("scout", 0),
                    "count": await store.turns.count_since("scout", 0),
                    "started": await store.turns.started_since("scout", 0),
                    "pending": [row.id for row in await store.outbox.pending("discord", limit=10)],
                    "fair": [row.id for row in await store.outbox.pending("discord", limit=10, per_channel=1)],
                    "row": (await store.outbox.get(pending)).state,
                    "queued": await store.outbox.count("pending"),
                    "outbox": [row.state for row in await store.outbox.list()],
                    "echoes": await store.outbox.load_recent_delivered(4_000),
                    "cursor": await store.cursors.get("scout"),
                    "cursors": await store.cursors.all(),
                    "push": await store.pushes.get("discord", "e-1"),
                }
        assert read == {  # the last commit: the held transaction's cursor move and publish are not seen
            "turn": "completed", "injections": ["x"], "turns": [turn], "usage": 7, "count": 1, "started": [1_000],
            "pending": [pending], "fair": [pending], "row": "pending", "queued": 1,
            "outbox": ["delivered", "pending"], "echoes": 1, "cursor": 5, "cursors": {"scout": 5},
            "push": b'{"accepted":true}',
        }
        assert await store.cursors.get("scout") == 9 and await store.outbox.count("pending") == 2  # once committed

    async def test_inside_a_transaction_they_see_its_own_writes(self, store: Store) -> None:
        """The task's own transaction reads through the writer's connection, so its uncommitted rows are there."""
        async with store.transaction():
            await store.cursors.set_many_nocommit([CursorMove("scout", 3, 1_000)])
            (queued,) = await store.outbox.insert_many_nocommit([publish("mine")])
            (turn,) = await store.turns.begin_many_nocommit([TurnStart("scout", (1,), 1_000)])
            assert await store.cursors.get("scout") == 3
            assert [row.id for row in await store.outbox.pending("discord", limit=10)] == [queued]
            assert (await store.turns.get(turn)).outcome is None


def publish(text: str) -> OutboxEntry:
    return OutboxEntry(agent="scout", turn_id=None, server_id="discord", channel_id=ROOM, thread_id=None,
                       conversation_id="conv_room", text=text, created_at=1_000)


class TestACommitBesideAHeldRead:
    async def test_a_connectors_item_is_committed_and_acked_while_a_read_stays_open(self, tmp_path: Path) -> None:
        """A read transaction held open on the reader holds up neither the commit nor the connector's answer."""
        spec = scripted_connector("disc", {
            "manifest": CHAT_MANIFEST, "handlers": {},
            "steps": [register(ROOM), {"wait": "test/deliver"}, incoming(message(ROOM, "m-1", "hello"))]},
            tmp_path, grant=CHAT_GRANT)
        async with memory_host(config_with(tmp_path, spec)) as host:
            store = host.writer.store
            assert store.reader is not None
            async with store.reader.connection() as conn:
                await conn.execute("BEGIN")
                ((before,),) = await conn.execute_fetchall("SELECT count(*) FROM items")  # the snapshot starts
                try:
                    await host.connectors["disc"].notify("test/deliver")
                    with anyio.fail_after(15):
                        while not record(tmp_path, "disc").done:
                            await anyio.sleep(0.02)
                    answer = record(tmp_path, "disc").answer(2)
                    assert "result" in answer, answer  # acked: committed while the read is open
                    ((during,),) = await conn.execute_fetchall("SELECT count(*) FROM items")
                    assert await store.items.last_id() >= 1  # another reader connection sees the commit
                finally:
                    await conn.execute("ROLLBACK")
        assert (before, during) == (0, 0)  # the held read still saw its snapshot: it was running throughout


@pytest.mark.parametrize("connections", [1, 3])
async def test_concurrent_reads_share_the_readers_connections(db_path: Path, connections: int) -> None:
    """More reads at once than connections: each waits for a free one, all complete, none sees a torn state."""
    async with open_store(db_path, reader_connections=connections) as store:
        ids = await store.items.insert_many([make_item(f"n{n}") for n in range(50)])
        results: list[int] = []

        async def read() -> None:
            results.append(len(await store.items.get_many(ids)))

        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(read)
        assert results == [50] * 10


async def test_a_conversations_context_is_read_through_its_index(db_path: Path) -> None:
    """context_rows for one conversation searches items_by_conversation instead of walking the table."""
    async with open_store(db_path, reader_connections=1) as store:  # one connection: the traced one reads
        await store.items.insert_many([make_item("hello")])
        assert store.reader is not None
        statements: list[str] = []
        async with store.reader.connection() as conn:
            await conn.set_trace_callback(statements.append)
        await store.items.context_rows("scout", limit=10, conversation_id="c-1")
        async with store.reader.connection() as conn:
            await conn.set_trace_callback(None)
            (read,) = [s for s in statements if "conversation_id" in s]
            plan = " ".join(str(row[-1]) for row in await conn.execute_fetchall(f"EXPLAIN QUERY PLAN {read}"))
    assert "USING INDEX items_by_conversation" in plan, plan
