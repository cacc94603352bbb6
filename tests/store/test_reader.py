"""The StoreReader: reads of items take read-only connections, never the writer's lock, and hold up no commit."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from mcplhost.store import Store, open_store

from ..harness import CHAT_GRANT, CHAT_MANIFEST, config_with, incoming, message, record, register, running_host
from ..harness import scripted as scripted_connector
from .conftest import make_item

ROOM = "disc:g1:room"
#: How long a read may take here while the writer's lock is held elsewhere; the old path waited forever.
READ_BOUND_S = 5.0


class TestReadsBesideTheWriter:
    async def test_item_reads_complete_while_another_task_holds_a_transaction_open(self, store: Store) -> None:
        """Context, catch-up, wake and export reads all answer while the writer's lock is taken and held."""
        (first,) = await store.items.insert_many([make_item("committed")])
        held, release = anyio.Event(), anyio.Event()

        async def hold_a_transaction() -> None:
            async with store.transaction():
                await store.items.insert_many_nocommit([make_item("not yet committed")])
                held.set()
                await release.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_a_transaction)
            await held.wait()
            with anyio.fail_after(READ_BOUND_S):
                context = await store.items.context_rows("scout", limit=10)
                by_conversation = await store.items.context_rows("scout", limit=10, conversation_id="c-1")
                caught_up = await store.items.after_as_written(0)
                woken = await store.items.get_many([first, first + 1])
                last = await store.items.last_id()
                exported = [item async for item in store.items.iterate()]
                thread = await store.items.thread_of("discord", ROOM, "m-1")
            release.set()
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
            held, release = anyio.Event(), anyio.Event()

            async def hold_a_transaction() -> None:
                async with store.transaction():
                    held.set()
                    await release.wait()

            async with anyio.create_task_group() as tg:
                tg.start_soon(hold_a_transaction)
                await held.wait()
                with anyio.move_on_after(0.2) as waited:
                    await store.items.last_id()
                release.set()
            assert waited.cancelled_caught


class TestACommitBesideAHeldRead:
    async def test_a_connectors_item_is_committed_and_acked_while_a_read_stays_open(self, tmp_path: Path) -> None:
        """A read transaction held open on the reader holds up neither the commit nor the connector's answer."""
        spec = scripted_connector("disc", {
            "manifest": CHAT_MANIFEST, "handlers": {},
            "steps": [register(ROOM), {"wait": "test/deliver"}, incoming(message(ROOM, "m-1", "hello"))]},
            tmp_path, grant=CHAT_GRANT)
        async with running_host(config_with(tmp_path, spec)) as host:
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
