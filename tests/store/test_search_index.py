"""The search index (mcplhost/store/search_index.py, search_reader.py, docs/operations.md#searching).

The indexed search returns exactly what the bounded scan of every row returns (a property over random
bodies, queries, filters, marks and pruning); a fresh item above the mark is found at once; an item
retention removed is found by nothing; a store from before the index opens at once and is indexed in the
background.
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.agents.hearing import heard_by
from mcplhost.store import NewItem, Store, StoredItem, open_store
from mcplhost.store.items import STORED_COLUMNS, stored_item
from mcplhost.store.migrate import Migration, default_folder, load_migrations
from mcplhost.store.readers import SearchError, SearchResult, compile_query, scan, search_items
from mcplhost.store.search_index import run_indexer
from mcplhost.store.search_query import Required, SearchFilter
from mcplhost.store.search_reader import FOLD_VARIANTS, SearchInterrupted, fts_terms

from ..properties import examples
from .conftest import make_item
from .test_search_query import ALPHABET, regexes

BASE_MS = 1_790_000_000_000
HEADER = "[source: abc / lit]"
SERVERS = ("disc", "zulip", None)
CHANNELS = ("disc:g1:a", "disc:g1:b", "zulip:x", None)
HEARS = (None, (), ("disc",), ("disc/disc:g1:a",), ("disc/*:b",), ("zulip", "disc/disc:g1:?"), ("disc/[ab]*",),
         ("disc/*[!a]",))


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty store of today's schema, copied for each example (migrating one takes longer than the example)."""
    path = tmp_path_factory.mktemp("template") / "empty.db"

    async def create() -> None:
        async with open_store(path):
            pass

    anyio.run(create)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path


def new_item(blocks: list[str], header: bool, agent: str | None, server: str | None, channel: str | None,
             minute: int) -> NewItem:
    content: list[dict[str, Any]] = [{"type": "text", "text": text} for text in blocks]
    metadata: dict[str, Any] = {"tags": []}
    if header:
        content.insert(0, {"type": "text", "text": HEADER})
        metadata["sourceHeader"] = HEADER
    if len(blocks) > 1:
        content.insert(len(content) - 1, {"type": "image", "data": "aGk=", "mimeType": "image/png"})
    if server is not None:
        metadata["serverId"] = server
    if channel is not None:
        metadata["channelId"] = channel
    return NewItem(role="user", content=content, metadata=metadata, created_at=BASE_MS + minute * 60_000,
                   agent=agent, participant="Alice")


ITEMS = st.lists(st.builds(new_item, st.lists(st.text(ALPHABET, max_size=24), min_size=1, max_size=3), st.booleans(),
                           st.sampled_from((None, None, None, "scout")), st.sampled_from(SERVERS),
                           st.sampled_from(CHANNELS), st.integers(0, 9)), max_size=16)
REGEXES = regexes()
FILTERS = st.builds(SearchFilter, heard=st.sampled_from(HEARS), channel=st.sampled_from((None, "disc:g1:a", "zulip:x")),
                    since_ms=st.sampled_from((None, BASE_MS + 5 * 60_000)))


def accepts(where: SearchFilter, item: StoredItem) -> bool:
    """The filter's rule in Python, from the rule's own owner (agents/hearing.py heard_by): the oracle."""
    server, channel = item.metadata.get("serverId"), item.metadata.get("channelId")
    if where.heard is not None and (item.agent is not None or not heard_by(list(where.heard), server, channel)):
        return False
    if where.channel is not None and channel != where.channel:
        return False
    return where.since_ms is None or item.created_at >= where.since_ms


def scanned(path: Path, query: str, *, as_regex: bool, ignore_case: bool, limit: int,
            where: SearchFilter) -> SearchResult:
    """The bounded scan of every row, newest first, the filter applied in Python: what the index must agree with."""
    pattern = compile_query(query, as_regex=as_regex, ignore_case=ignore_case)
    with sqlite3.connect(path) as conn:
        rows = conn.execute(f"SELECT {', '.join(STORED_COLUMNS)} FROM items ORDER BY id DESC").fetchall()
    conn.close()
    return scan([stored_item(row) for row in rows], pattern, limit, deadline=float("inf"), stop=threading.Event(),
                where=lambda item: accepts(where, item))


@st.composite
def queries(draw: st.DrawFn, items: list[NewItem]) -> tuple[str, bool, bool]:
    """(query, as_regex, ignore_case): a piece of a body, random text, or an expression, often one that matches."""
    ignore_case = draw(st.booleans())
    texts = [block["text"] for item in items for block in item.content if block.get("type") == "text"]
    piece = ""
    if texts:
        text = draw(st.sampled_from(texts))
        start = draw(st.integers(0, len(text)))
        piece = text[start : draw(st.integers(start, len(text)))]
        if ignore_case and draw(st.booleans()):
            piece = piece.swapcase()
    kind = draw(st.sampled_from(["piece", "text", "regex", "around"]))
    if kind == "piece":
        return piece or "x", False, ignore_case
    if kind == "text":
        return draw(st.text(ALPHABET, min_size=1, max_size=6)), False, ignore_case
    if kind == "regex":
        return draw(REGEXES), True, ignore_case
    glue = draw(st.sampled_from(["", ".*", "(?:x)?", r"\s*", "(?:a|b)?", "{e<=1}", "+", "|ab"]))
    cut = draw(st.integers(0, len(piece)))
    return regex.escape(piece[:cut]) + glue + regex.escape(piece[cut:]), True, ignore_case


#: Searches compared on each generated store (a store costs more to set up than a search).
SEARCHES_PER_STORE = 4


class TestTheIndexAgreesWithTheScan:
    @settings(max_examples=examples(40))
    @given(ITEMS, st.data())
    def test_the_indexed_search_returns_exactly_what_the_scan_returns(
            self, template: Path, tmp_path_factory: pytest.TempPathFactory, items: list[NewItem],
            data: st.DataObject) -> None:
        """Hits, order (newest first), snippets and the limit agree, whatever was indexed or pruned before."""
        searches = [(*data.draw(queries(items)), data.draw(FILTERS), data.draw(st.integers(0, 5)))
                    for _ in range(SEARCHES_PER_STORE)]
        marked, pruned, later = (data.draw(st.integers(0, len(items))) for _ in range(3))
        merge = data.draw(st.booleans())
        path = tmp_path_factory.mktemp("example") / "host.db"
        shutil.copyfile(template, path)

        async def run() -> list[SearchResult | None]:
            async with open_store(path) as store:
                if items:
                    await store.items.insert_many(items)
                await index_up_to(store, marked, merge=merge)
                if pruned:  # every item is old: retention deletes ids 1..pruned, indexed or not
                    await store.retention.prune_batch(after_id=0, cutoff_ms=BASE_MS * 2, floor_id=pruned,
                                                      now_ms=BASE_MS * 2)
                await index_up_to(store, later, merge=merge)
                found: list[SearchResult | None] = []
                for query, as_regex, ignore_case, where, limit in searches:
                    try:
                        found.append(await search_items(store, query, as_regex=as_regex, ignore_case=ignore_case,
                                                        limit=limit, where=where, deadline_s=60))
                    except SearchError:
                        found.append(None)
                return found

        for (query, as_regex, ignore_case, where, limit), indexed in zip(searches, anyio.run(run), strict=True):
            if indexed is None:
                with pytest.raises(SearchError):
                    compile_query(query, as_regex=as_regex, ignore_case=ignore_case)
                continue
            expected = scanned(path, query, as_regex=as_regex, ignore_case=ignore_case, limit=limit, where=where)
            assert not indexed.stopped_early
            if indexed.timed_out or expected.timed_out:
                # A generated expression can be pathological (a fuzzy group repeated, `(?>(?:é{i<=1,d<=1})+)`)
                # and run out of its time per item (REGEX_TIMEOUT_S) on a busy machine: which items it ran out on
                # depends on the machine, each search reports them (`timed_out`), and the hits may differ.
                continue
            assert indexed.hits == expected.hits, (query, as_regex, ignore_case, where, limit)
        with sqlite3.connect(path) as conn:
            conn.execute("INSERT INTO items_search (items_search) VALUES ('integrity-check')")
        conn.close()

    def test_every_character_that_matches_an_ascii_one_ignoring_case_is_found_through_the_index(
            self, tmp_path: Path) -> None:
        """Where `regex` matches a non-ASCII character with an ASCII one (K with the Kelvin sign, s with ſ, i with
        İ), the trigram tokenizer folds them alike, or the lookup asks for each form (FOLD_VARIANTS)."""
        others = "".join(chr(code) for code in range(0x80, 0x110000) if not 0xD800 <= code <= 0xDFFF)
        relatives = {found.group() for found in regex.finditer("[\x20-\x7e]", others,
                                                                regex.IGNORECASE | regex.FULLCASE)}
        pairs = [(ascii_char, other) for other in sorted(relatives) for ascii_char in map(chr, range(0x20, 0x7f))
                 if regex.fullmatch(regex.escape(ascii_char), other, regex.IGNORECASE | regex.FULLCASE)]
        assert {(a.lower(), o) for a, o in pairs} >= {("k", "\u212a"), ("s", "\u017f"), ("i", "\u0130")}
        conn = sqlite3.connect(tmp_path / "fold.db")
        conn.execute("CREATE VIRTUAL TABLE items_search USING fts5(body, tokenize = 'trigram', content = '',"
                     " detail = none, columnsize = 0)")
        for rowid, (ascii_char, other) in enumerate(pairs, start=1):
            conn.execute("INSERT INTO items_search (rowid, body) VALUES (?, ?)", (rowid, f"x{other}y"))
            found = conn.execute("SELECT rowid FROM items_search WHERE items_search MATCH ?",
                                 (" AND ".join(fts_terms(Required((f"x{ascii_char}y",), True))),)).fetchall()
            assert (rowid,) in found, (ascii_char, other, FOLD_VARIANTS.get(ascii_char))
        conn.close()


async def index_up_to(store: Store, count: int, *, merge: bool = False) -> None:
    """Index `count` more items (if there are that many above the mark), in batches of a few; with `merge`, a
    small merge of the index's segments after each (each batch adds a segment: they merge four at a time)."""
    while count > 0:
        done = await store.search_index.index_next(min(count, 4))
        if merge:
            await store.search_index.merge_step(1)
        if not done:
            return
        count -= done


class TestFreshAndRemovedItems:
    async def test_an_item_above_the_mark_is_found_at_once(self, store: Store, engine: str) -> None:
        """The indexer has not reached a fresh item yet: the search reads the rows above the mark (both engines)."""
        await store.items.insert_many([make_item(f"old needle {n}") for n in range(5)])
        await index_up_to(store, 5)
        (fresh,) = await store.items.insert_many([make_item("a fresh needle")])
        assert (await store.search_index.progress()).indexed_to < fresh
        found = await search_items(store, "needle", limit=2)
        assert [hit["id"] for hit in found.hits] == [fresh, fresh - 1]

    async def test_an_item_retention_removed_is_found_by_nothing(self, store: Store) -> None:
        """Pruned items leave the index in the same transaction: neither the search nor the index has them."""
        ids = await store.items.insert_many([make_item(f"needle {n}", created_at=BASE_MS) for n in range(6)])
        await index_up_to(store, 6)
        await store.retention.prune_batch(after_id=0, cutoff_ms=BASE_MS + 1, floor_id=ids[3], now_ms=BASE_MS + 1)
        found = await search_items(store, "needle")
        assert [hit["id"] for hit in found.hits] == [ids[5], ids[4]]
        async with store.reader.connection() as conn:  # type: ignore[union-attr]
            rows = await conn.execute_fetchall("SELECT rowid FROM items_search WHERE items_search MATCH ?",
                                               (" AND ".join(fts_terms(Required(("needle",), False))),))
        assert [row[0] for row in rows] == [ids[4], ids[5]]


class TestMerging:
    async def test_merged_segments_answer_as_before_and_retention_still_deletes_from_them(
            self, store: Store, db_path: Path) -> None:
        """Batches of a few items make many segments; the indexer's merges fold them (with work to do, then
        none), and the searches and retention's deletes are the same either side."""
        ids = await store.items.insert_many([make_item(f"needle {n}", created_at=BASE_MS) for n in range(40)])
        await index_up_to(store, 40)
        before = await search_items(store, "needle", limit=100)
        worked = [await store.search_index.merge_step(1) for _ in range(40)]
        assert worked[0] and not worked[-1]
        assert (await search_items(store, "needle", limit=100)).hits == before.hits
        await store.retention.prune_batch(after_id=0, cutoff_ms=BASE_MS + 1, floor_id=ids[29], now_ms=BASE_MS + 1)
        assert [hit["id"] for hit in (await search_items(store, "needle", limit=100)).hits] == ids[30:][::-1]
        with sqlite3.connect(db_path) as conn:
            conn.execute("INSERT INTO items_search (items_search) VALUES ('integrity-check')")
        conn.close()


class TestPagesAndStatements:
    async def test_several_pages_of_rows_and_of_candidates_agree_with_the_scan(self, store: Store,
                                                                               db_path: Path) -> None:
        """More rows than a page above the mark, and more candidates than a page below it, with a filter."""
        from mcplhost.store.search_reader import SEARCH_PAGE_ROWS

        count = SEARCH_PAGE_ROWS * 5
        await store.items.insert_many([make_item(f"{'needle' if n % 3 else 'hay'} {n}",
                                                 channel=("disc:g1:a", "disc:g1:b")[n % 2]) for n in range(count)])
        await index_up_to(store, count // 2)
        where = SearchFilter(channel="disc:g1:a")
        found = await search_items(store, "needle", limit=count, where=where)
        expected = scanned(db_path, "needle", as_regex=False, ignore_case=False, limit=count, where=where)
        assert found.hits == expected.hits and len(found.hits) == count // 3

    def test_the_filters_are_conditions_the_statements_answer_from_indexes(self, tmp_path: Path,
                                                                           template: Path) -> None:
        """Each statement reads through an index and never sorts: `--channel` and an exact channel walk
        items_by_channel, a connector items_by_server, `--since` finds its first id through items_by_time, and
        the candidates come from the search index, newest first, each row by its id."""
        path = tmp_path / "plan.db"
        shutil.copyfile(template, path)
        hears = ("disc", "zulip/zulip:x", "disc/*:b")

        async def plans() -> list[str]:
            async with open_store(path) as store:
                reads = store.open_search_reads(lambda: False)
                conn = reads._conn  # type: ignore[attr-defined]
                statements: list[str] = []
                conn.set_trace_callback(statements.append)
                try:
                    list(reads.rows(SearchFilter(channel="c"), above=0, through=10))
                    list(reads.rows(SearchFilter(heard=hears), above=0, through=10))
                    list(reads.candidates(Required(("abc",), False), SearchFilter(heard=hears), above=0, through=10))
                    reads.since_floor(BASE_MS)
                    conn.set_trace_callback(None)
                    return ["\n".join(str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
                            for sql in statements if sql.startswith(("SELECT i.id", "SELECT count(*), min(id)"))]
                finally:
                    reads.close()

        by_channel, *by_entry, candidates, since = anyio.run(plans)
        assert "items_by_channel" in by_channel
        assert ["items_by_server" in by_entry[0], "items_by_channel" in by_entry[1], "items_by_server" in by_entry[2]] \
            == [True, True, True]
        scan_index, by_id = candidates.splitlines()
        assert scan_index.startswith("SCAN items_search VIRTUAL TABLE") and "PRIMARY KEY" in by_id
        assert "items_by_time" in since
        assert not any("TEMP B-TREE" in plan for plan in [by_channel, *by_entry, candidates])

    async def test_a_statement_stopped_by_its_deadline_ends_the_search_with_what_it_found(
            self, store: Store) -> None:
        """SQLite's progress handler stops a long statement; the search says it stopped early, hits kept."""
        await store.items.insert_many([make_item("needle") for _ in range(3000)])
        reads = store.open_search_reads(lambda: True)
        try:  # a glob no row's channel matches: one statement walks every row, long enough to be asked to stop
            with pytest.raises(SearchInterrupted):
                list(reads.newest_first(None, SearchFilter(heard=("discord/nowhere*",))))
        finally:
            reads.close()

        def interrupted() -> Any:
            yield StoredItem(id=2, agent=None, participant=None, role="user", content=[{"type": "text",
                             "text": "needle"}], metadata={}, created_at=0)
            raise SearchInterrupted

        found = scan(interrupted(), compile_query("needle", as_regex=False, ignore_case=False), 5,
                     deadline=float("inf"), stop=threading.Event())
        assert [hit["id"] for hit in found.hits] == [2] and found.stopped_early and found.oldest_searched == 2


class TestAStoreFromBeforeTheIndex:
    async def test_it_opens_at_once_answers_correctly_while_it_builds_and_is_indexed_in_the_background(
            self, tmp_path: Path) -> None:
        """The migrations before the search index's made the store; today's opens it without indexing, searches
        it by scan, and the indexer, a background task, builds the index, after which the same search tests only
        candidates."""
        old = tmp_path / "previous-release"
        old.mkdir()
        for migration in previous_release():
            name = f"{migration.version:04d}_{migration.name}.sql"
            shutil.copy(Path(str(default_folder())) / name, old / name)
        db = tmp_path / "host.db"
        async with open_store(db, migrations_folder=old) as store:
            await store.items.insert_many([make_item(f"{'needle' if n % 100 == 0 else 'hay'} {n}")
                                           for n in range(1200)])
        async with open_store(db) as store:
            assert await store.schema_version() == len(load_migrations())
            progress = await store.search_index.progress()
            assert (progress.indexed_to, progress.newest) == (0, 1200)  # the migration indexed nothing
            during = await search_items(store, "needle")
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_indexer, store.search_index)
                await wait_for_progress(store)
                tg.cancel_scope.cancel()
            after = await search_items(store, "needle")
        assert during.hits == after.hits and [hit["id"] for hit in after.hits] == list(range(1101, 0, -100))
        assert during.searched == 1200 and after.searched == 12


def previous_release() -> list[Migration]:
    """The migrations of the release before the search index: every one before it."""
    migrations = load_migrations()
    (index,) = [n for n, migration in enumerate(migrations) if migration.name == "search_index"]
    return migrations[:index]


async def wait_for_progress(store: Store) -> None:
    """Await the index reaching the newest item (the indexer runs in the background; bounded)."""
    with anyio.fail_after(30):
        while (await store.search_index.progress()).behind:
            await anyio.sleep(0.02)
