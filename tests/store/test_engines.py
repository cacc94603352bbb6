"""Both engines alike: the same rows export the same, and PostgreSQL's ids become visible in order (store/order.py)."""

from __future__ import annotations

import anyio
import msgspec

from mcplhost.store import Store, export_line, open_store, turn_line
from mcplhost.store.outbox import outbox_line
from mcplhost.store.postgres import PgStore
from tests.cli.rows_fixture import FIXTURES, write_rows
from tests.postgres import PostgresDatabase

from .conftest import make_item

EXPORTS = ("messages.jsonl", "turns.jsonl", "outbox.jsonl")


async def pg_exports(url: str) -> dict[str, list[bytes]]:
    """`messages`, `turns` and `outbox --json` over the database at `url`, by the lines the CLI prints."""
    async with open_store(url) as store:
        return {"messages.jsonl": [export_line(item) async for item in store.items.iterate()],
                "turns.jsonl": [turn_line(turn) async for turn in store.turns.iterate()],
                "outbox.jsonl": [outbox_line(row) async for row in store.outbox.iterate()]}


async def test_every_row_kind_exports_on_postgresql_as_on_sqlite(migrated_db: PostgresDatabase) -> None:
    """tests/cli/rows_fixture.py's rows, written through the host's code into PostgreSQL, export field for field
    as the committed SQLite exports (tests/cli/test_export_bytes.py holds SQLite to them): ids by position, times
    as epoch ms, both body digests."""
    await write_rows(migrated_db.url)  # type: ignore[arg-type]  # open_store takes a URL as well as a path
    found = await pg_exports(migrated_db.url)
    for name in EXPORTS:
        expected = (FIXTURES / name).read_bytes().splitlines()
        assert len(found[name]) == len(expected), name
        for position, (line, committed) in enumerate(zip(found[name], expected)):
            assert msgspec.json.decode(line) == msgspec.json.decode(committed), (name, position)
        assert found[name] == expected, name  # and byte for byte: json keeps the text as written
    async with open_store(migrated_db.url) as store:  # the two body digests, read back typed (item.meta)
        digests = [(item.meta.source_body_digest, item.meta.stored_body_digest) async for item in store.items.iterate()]
    committed = [msgspec.json.decode(line)["metadata"] for line in (FIXTURES / "messages.jsonl").read_bytes().splitlines()]
    assert digests == [(m.get("sourceBodyDigest"), m.get("storedBodyDigest")) for m in committed]
    assert any(all(pair) for pair in digests)


class TestIdsVisibleInOrder:
    """Two stores (two pools: two hosts) on one database; a follower reading `id > cursor` must never pass an id
    that commits later."""

    async def test_without_the_order_lock_a_follower_would_pass_an_open_id(self, migrated_db: PostgresDatabase):
        """The hazard the lock removes, shown with plain inserts: B's later id commits while A's is still open."""
        import asyncpg

        a, b = await asyncpg.connect(migrated_db.url), await asyncpg.connect(migrated_db.url)
        insert = ("INSERT INTO items (role, content, metadata, created_at) VALUES ('user', '[]', '{}', 0)"
                  " RETURNING id")
        try:
            async with a.transaction():
                first = await a.fetchval(insert)
                second = await b.fetchval(insert)  # autocommit: committed at once
                seen = [row[0] for row in await b.fetch("SELECT id FROM items WHERE id > 0 ORDER BY id")]
                assert (first, second, seen) == (1, 2, [2])  # a cursor moved to 2 here would never read 1
        finally:
            await a.close()
            await b.close()

    async def test_a_later_writer_waits_for_the_earlier_ones_commit(self, migrated_db: PostgresDatabase):
        async with open_store(migrated_db.url) as host_a, open_store(migrated_db.url) as host_b:
            assert isinstance(host_a, PgStore)
            a_inserted, a_may_commit, b_done = anyio.Event(), anyio.Event(), anyio.Event()
            b_ids: list[int] = []

            async def writer_a() -> None:
                async with host_a.transaction():
                    await host_a.items.insert_many_nocommit([make_item("from a")])
                    a_inserted.set()
                    await a_may_commit.wait()

            async def writer_b() -> None:
                await a_inserted.wait()
                b_ids.extend(await host_b.items.insert_many([make_item("from b")]))
                b_done.set()

            async def b_waits_on_the_lock() -> bool:
                async with host_a._database.read() as conn:
                    ((waiting,),) = await conn.fetch(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                return int(waiting) == 1

            async with anyio.create_task_group() as tg:
                tg.start_soon(writer_a)
                tg.start_soon(writer_b)
                await a_inserted.wait()
                with anyio.fail_after(15):
                    while not await b_waits_on_the_lock():  # B's insert has reached the lock and waits there
                        await anyio.sleep(0.01)
                assert not b_done.is_set()
                assert [item.id for item in await host_b.items.after(0)] == []  # a follower sees neither yet
                a_may_commit.set()
                await b_done.wait()
            assert [item.id for item in await host_b.items.after(0)] == [1, *b_ids] == [1, 2]

    async def test_a_follower_sees_every_committed_id(self, migrated_db: PostgresDatabase):
        """Two writers committing small groups at once; a follower advancing its cursor by what it read ends having
        seen every id, each once."""
        rounds = 30
        async with open_store(migrated_db.url) as host_a, open_store(migrated_db.url) as host_b:
            seen: list[int] = []
            finished: list[str] = []

            async def write(host: Store, label: str) -> None:
                for n in range(rounds):
                    await host.items.insert_many([make_item(f"{label}{n}"), make_item(f"{label}{n}+")])
                finished.append(label)

            async def follow() -> None:
                cursor = 0
                while True:
                    last_round = len(finished) == 2  # read once more after both writers are done
                    rows = await host_b.items.after(cursor)
                    seen.extend(item.id for item in rows)
                    cursor = rows[-1].id if rows else cursor
                    if last_round:
                        return
                    await anyio.sleep(0)

            async with anyio.create_task_group() as tg:
                tg.start_soon(write, host_a, "a")
                tg.start_soon(write, host_b, "b")
                tg.start_soon(follow)
            assert seen == list(range(1, 4 * rounds + 1))
