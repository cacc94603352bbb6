"""Both engines alike: the same rows export the same, and PostgreSQL's ids become visible in order (store/order.py)."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path

import anyio
import asyncpg
import msgspec
import regex

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


class TestSearchOnPostgresql:
    """The search on pg_trgm (store/pg_search.py) returns what the bounded scan of every row returns."""

    async def test_indexed_and_fresh_rows_answer_as_the_scan_does(self, migrated_db: PostgresDatabase) -> None:
        from mcplhost.store.readers import compile_query, scan, search_items
        from mcplhost.store.search_query import SearchFilter
        from tests.store.test_search_index import BASE_MS, accepts, index_up_to, new_item

        bodies = ["a needle here", "NEEDLE upper", "hay only", "needle_100% sure", "ne edle", "the needle's eye",
                  "İstanbul needle", "nothing", "kelvin K sign", "needles twice needle",
                  # ILIKE candidates: the Kelvin sign, long s and dotted I match ASCII letters ignoring case
                  "\u212aelvin ſtandard \u0130stanbul", "Blue Harbour Lights", "the blue harbour lights tonight",
                  "ΣΟΦΊΑ σοφία", "STRASSE straße"]
        servers = ["disc", "zulip", None]
        channels = ["disc:g1:a", "disc:g1:b", "zulip:x", None]
        items = [new_item([body], n % 2 == 0, "scout" if n % 5 == 4 else None, servers[n % 3], channels[n % 4], n)
                 for n, body in enumerate(bodies * 3)]
        async with open_store(migrated_db.url) as store:
            await store.items.insert_many(items)
            await index_up_to(store, 17)  # a mark in the middle: rows above it are read, rows below it looked up
            everything = [item async for item in store.items.iterate()][::-1]
            queries = [("needle", False, False), ("needle", False, True), ("100%", False, False), ("_1", False, False),
                       (r"ne+dle\b", True, False), ("xyz", False, False),
                       # a phrase looked up by its words, tested whole; ignoring case through ILIKE, cut at the
                       # letters folding apart (k, s, i); non-ASCII needles read every row
                       ("the blue harbour lights", False, False), ("BLUE HARBOUR", False, True),
                       (r"harbour\s+lights", True, True), ("KELVIN", False, True), ("standard", False, True),
                       ("istanbul needle", False, True), ("σοφία", False, True), ("strasse", False, True),
                       ("NEEDLE_100%", False, True)]
            # Every kind of hears entry (none, a connector, an exact channel, globs) and the other two filters.
            wheres = [SearchFilter(heard=heard) for heard in (None, ("disc",), ("disc/disc:g1:a",),
                                                              ("zulip", "disc/disc:g1:?"), ("disc/*[!a]",))] + [
                SearchFilter(channel="disc:g1:a"), SearchFilter(since_ms=BASE_MS + 5 * 60_000)]
            for query, as_regex, ignore_case in queries:
                pattern = compile_query(query, as_regex=as_regex, ignore_case=ignore_case)
                for where in wheres:
                    found = await search_items(store, query, as_regex=as_regex, ignore_case=ignore_case, limit=100,
                                               where=where)
                    expected = scan(everything, pattern, 100, deadline=float("inf"), stop=threading.Event(),
                                    where=lambda item, where=where: accepts(where, item))
                    assert found.hits == expected.hits, (query, where)
            assert (await search_items(store, "needle", limit=100)).hits  # the comparison compared something
            assert len((await search_items(store, "KELVIN", ignore_case=True, limit=100)).hits) == 6

    async def test_small_pages_and_id_batches_give_every_candidate_once_newest_first(
            self, migrated_db: PostgresDatabase) -> None:
        """The reads' paging (store/pg_search.py): pages and candidate-id batches smaller than the candidates."""
        from mcplhost.store.pg_search import PgSearchReads
        from mcplhost.store.search_query import SearchFilter, required
        from tests.store.test_search_index import index_up_to, new_item

        bodies = ["blue harbour lights", "harbour, then lights", "lights harbour", "no", "Harbour Lights"]
        items = [new_item([body], False, None, "disc", f"disc:g1:{n % 3}", n) for n, body in enumerate(bodies * 5)]
        async with open_store(migrated_db.url) as store:
            await store.items.insert_many(items)
            await index_up_to(store, 22)
            everything = [item async for item in store.items.iterate()][::-1]
            for query, ignore_case, where in [("harbour lights", False, SearchFilter()),
                                              (r"harbour\W+lights", True, SearchFilter()),
                                              ("harbour lights", False, SearchFilter(channel="disc:g1:1"))]:
                needs = required(query, as_regex=True, ignore_case=ignore_case)
                for page_rows, candidate_ids in [(1, 1), (2, 3), (3, 2), (200, 1000)]:
                    reads = PgSearchReads(store._database, lambda: False, page_rows=page_rows,
                                          candidate_ids=candidate_ids)
                    found = await anyio.to_thread.run_sync(lambda reads=reads, needs=needs, where=where: [
                        item.id for item in reads.newest_first(needs, where)])
                    in_order = regex.compile(".*?".join(regex.escape(run) for run in needs.runs),
                                             regex.DOTALL | (regex.IGNORECASE if ignore_case else 0))
                    expected = [item.id for item in everything
                                if (item.id > 22 or in_order.search(item.content[0]["text"]))
                                and (where.channel is None or item.metadata.get("channelId") == where.channel)]
                    assert found == expected, (query, page_rows, candidate_ids)


def test_the_index_lookup_uses_what_folds_alike_and_the_longest_words() -> None:
    """store/pg_search.py index_lookup: ILIKE only over ASCII stretches without k, s, i; the longest words."""
    from mcplhost.store.pg_search import IndexLookup, index_lookup
    from mcplhost.store.search_query import required

    def lookup(query: str, *, as_regex: bool = False, ignore_case: bool = False) -> IndexLookup | None:
        return index_lookup(required(query, as_regex=as_regex, ignore_case=ignore_case))

    assert lookup("the blue harbour lights") == IndexLookup(("harbour", "lights", "blue"),
                                                            ("the blue harbour lights",), False)
    assert lookup("deployment") == IndexLookup(("deployment",), (), False)
    assert lookup("the cat") == IndexLookup(("the cat",), (), False)  # no word long enough: the run itself
    assert lookup("ZANZIBARITE", ignore_case=True) == IndexLookup(("ZANZ",), ("ZANZ", "BAR"), True)
    assert lookup(r"harbour\s+lights", as_regex=True) == IndexLookup(("harbour", "lights"), ("harbour", "lights"),
                                                                      False)  # in this order
    # "lights" cut at i and s: "ght" left, too short a word to look up, tested on the rows after "harbour"
    assert lookup(r"harbour\s+lights", as_regex=True, ignore_case=True) == IndexLookup(("harbour",),
                                                                                       ("harbour", "ght"), True)
    assert lookup("kiss kiss", ignore_case=True) is None  # every stretch too short: the scan
    assert lookup("σοφία", ignore_case=True) is None
    assert lookup("σοφία") == IndexLookup(("σοφία",), (), False)  # exact: any character
    assert lookup("ab", ignore_case=True) is None


async def test_both_engines_migrate_to_the_same_columns(migrated_db: PostgresDatabase, tmp_path: Path) -> None:
    """Every table's columns (name, NULL allowed, integer or text) are the same after either engine's migrations:
    a column added to one engine's file and not the other's fails here. The search index's own table differs by
    design (an FTS5 table on SQLite)."""
    async with open_store(tmp_path / "schema.db"):
        pass
    sqlite_columns: set[tuple[str, str, bool, str]] = set()
    with closing(sqlite3.connect(tmp_path / "schema.db")) as conn:
        tables = [name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
            " AND name NOT LIKE 'items_search%'")]
        for table in tables:
            for _, column, declared, notnull, _, primary in conn.execute(f"PRAGMA table_info({table})"):
                sqlite_columns.add((table, column, not (notnull or primary), SQLITE_CLASSES[declared]))
    conn_pg = await asyncpg.connect(migrated_db.url)
    try:
        rows = await conn_pg.fetch("SELECT table_name, column_name, is_nullable, data_type FROM information_schema.columns"
                                   " WHERE table_schema = current_schema() AND table_name <> 'items_search'")
    finally:
        await conn_pg.close()
    pg_columns = {(table, column, nullable == "YES", PG_CLASSES[kind]) for table, column, nullable, kind in rows}
    assert sqlite_columns == pg_columns
    assert ("items", "metadata", False, "text") in pg_columns


#: Each engine's declared column types, by the class both read and write them as.
SQLITE_CLASSES = {"INTEGER": "integer", "TEXT": "text"}
PG_CLASSES = {"bigint": "integer", "text": "text", "json": "text"}
