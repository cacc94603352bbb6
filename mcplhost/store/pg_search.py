"""The search index's writes on PostgreSQL (pg_trgm, migrations/postgresql/*_search_index.sql).

The same `SearchIndex` as SQLite's FTS5 one (store/search_index.py): the indexer
follows the items by id, writing each body as searched (`index_text`, in Python:
the server cannot call it) into items_search, whose trigram GIN index PostgreSQL
keeps itself, so there is nothing to merge. The mark is safe to follow because
items' ids become visible in order (store/order.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Iterator, Sequence
from fnmatch import fnmatchcase
from typing import Any

import anyio
import msgspec

from mcplhost.store.connection import Connections
from mcplhost.store.items import STORED_COLUMNS, StoredItem, stored_item
from mcplhost.store.search_index import INDEX_BATCH_ROWS, IndexWrites, index_text
from mcplhost.store.search_query import INDEX_RUN_MIN_CHARS, IndexProgress, Required, SearchFilter
from mcplhost.store.search_reader import GLOB_CHARACTERS, SEARCH_PAGE_ROWS, SearchInterrupted, filter_sql

_COLUMNS = ", ".join(f"i.{column}" for column in STORED_COLUMNS)
#: What LIKE reads as a wildcard or its escape (the default escape is the backslash).
_LIKE_SPECIAL = re.compile(r"[%_\\]")
#: The ASCII letters that a search ignoring case (`regex`, FULLCASE) matches with a character outside ASCII
#: ("K" with the Kelvin sign, "s" with "ſ", "i" with "İ"), or that a locale lowers to another ("I" → "ı" in
#: Turkish). PostgreSQL's ILIKE lowers by the database's locale (the C locale: ASCII only), so a run is cut
#: at these; every other ASCII character folds alike in Python and in any locale.
_FOLDS_APART = frozenset("iksIKS")
#: Stretches of characters that ILIKE folds as the search does: ASCII but for _FOLDS_APART.
_FOLDS_ALIKE = re.compile("[^" + "".join(sorted(_FOLDS_APART)) + "\\x80-\\U0010ffff]+")
#: A word as pg_trgm reads one (its trigrams are taken word by word): letters and digits; ASCII ones only, as
#: a database in the C locale takes no other character for a letter (a word of them has no trigram).
_WORD = re.compile(r"[A-Za-z0-9]+")
#: A run's words shorter than this are not looked up alone (a 3-letter word is one trigram, often a common one).
WORD_MIN_CHARS = 4
#: A pooled connection keeps its prepared statements, and after five runs PostgreSQL may plan one for any
#: parameters: for `LIKE ?` that reads the newest rows through the primary key, testing each, where the trigram
#: index would answer an absent word at once. Each page is planned for its own patterns.
_CUSTOM_PLANS = "SET plan_cache_mode = force_custom_plan"
#: Candidates' ids one statement asks the index for at most (their rows are then read a page at a time).
CANDIDATE_IDS = 1000
_ROWS_BY_ID = f"SELECT {_COLUMNS} FROM items AS i WHERE i.id = ANY(CAST(? AS BIGINT[])) ORDER BY i.id DESC"
#: A statement's first page is this small (the command's default --limit): a common word's rows are found by
#: reading the newest rows until that many hold it, and most searches need no more.
FIRST_PAGE_ROWS = 50
#: At most this many words of a query are looked up in the index (the longest); the rest are tested on the rows.
INDEX_PIECES_USED = 3


class PgSearchIndex(IndexWrites):
    """The index's writes (the indexer's batches, retention's forgetting) and its progress, on PostgreSQL."""

    async def index_next(self, limit: int = INDEX_BATCH_ROWS) -> int:
        """Index the next `limit` items above the mark and move it past them, in one transaction; how many."""
        async with self._holding("search_index.index_next") as conn:
            rows = await conn.fetch(
                "SELECT id, CAST(content AS TEXT), CAST(metadata AS TEXT) FROM items"
                " WHERE id > (SELECT indexed_to FROM search_index) ORDER BY id LIMIT ?", (limit,))
            if not rows:
                return 0
            await conn.executemany("INSERT INTO items_search (item_id, body) VALUES (?, ?) ON CONFLICT DO NOTHING",
                                   [(item_id, index_text(content, metadata)) for item_id, content, metadata in rows])
            # GREATEST: another host's indexer may have moved the mark past this batch meanwhile.
            await conn.execute("UPDATE search_index SET indexed_to = GREATEST(indexed_to, ?)", (rows[-1][0],))
            return len(rows)

    async def merge_step(self, pages: int = 0) -> bool:
        """Nothing to merge: PostgreSQL maintains the GIN index itself."""
        return False

    async def forget_nocommit(self, ids: Sequence[int]) -> None:
        """Take the items `ids` out of the index, inside the caller's transaction, before it deletes them."""
        conn = self._connections.writer("search_index.forget_nocommit")
        await conn.execute("DELETE FROM items_search WHERE item_id = ANY(CAST(? AS BIGINT[]))", (list(ids),))

    async def progress(self) -> IndexProgress:
        """The mark and the newest item's id, read together (one statement, one snapshot)."""
        async with self._connections.read() as conn:
            ((mark, newest),) = await conn.fetch(
                "SELECT (SELECT indexed_to FROM search_index), (SELECT coalesce(max(id), 0) FROM items)")
        return IndexProgress(indexed_to=mark, newest=newest)


class PgSearchReads:
    """One search's reads on PostgreSQL, from its worker thread: each page one statement on a pooled connection,
    run on the event loop (`anyio.from_thread`), the thread decoding rows one at a time.

    The same order as SQLite's `IndexReader`: the rows above the mark, newest first, then the indexed rows
    whose body holds every run the query requires (`index_lookup`: a few of its words looked up in the trigram
    index, the whole runs tested on the rows found), newest first; a superset the search tests against each
    row's own text. Ignoring case, ILIKE over the stretches PostgreSQL folds as Python does; a query with none
    reads every row (the database's locale folds other characters its own way, so it could miss a match).
    `interrupt` is asked between pages.
    """

    def __init__(self, connections: Connections, interrupt: Callable[[], bool], *,
                 page_rows: int = SEARCH_PAGE_ROWS, candidate_ids: int = CANDIDATE_IDS) -> None:
        self._connections = connections
        self._interrupt = interrupt
        self._page_rows = page_rows
        self._candidate_ids = candidate_ids

    def close(self) -> None:
        """Nothing held between pages."""

    def newest_first(self, needs: Required | None, where: SearchFilter) -> Generator[StoredItem, None, None]:
        ((mark, newest),) = self._fetch(
            "SELECT (SELECT indexed_to FROM search_index), (SELECT coalesce(max(id), 0) FROM items)", ())
        mark = min(int(mark), int(newest))
        condition, params = _filter(where)
        rows = f"SELECT {_COLUMNS} FROM items AS i WHERE i.id > ? AND i.id < ? AND {condition} ORDER BY i.id DESC LIMIT ?"
        lookup = index_lookup(needs)
        if lookup is None:
            yield from self._heard(where, self._pages(rows, 0, int(newest), params))
            return
        if mark < int(newest):
            yield from self._heard(where, self._pages(rows, mark, int(newest), params))
        operator = "ILIKE" if lookup.ignore_case else "LIKE"
        # The pieces are the index's conditions; the whole runs are tested on each row the pieces find (`|| ''`
        # keeps the planner from looking their every trigram up in the index too).
        conditions = " AND ".join([f"s.body {operator} ?" for _ in lookup.pieces]
                                  + [f"(s.body || '') {operator} ?" for _ in lookup.runs[:1]])
        patterns = [_contains(piece) for piece in lookup.pieces] + ([_in_order(lookup.runs)] if lookup.runs else [])
        if params or condition != "TRUE":
            candidates = (f"SELECT {_COLUMNS} FROM items_search AS s JOIN items AS i ON i.id = s.item_id"
                          f" WHERE s.item_id > ? AND s.item_id < ? AND {conditions} AND {condition}"
                          " ORDER BY s.item_id DESC LIMIT ?")
            yield from self._heard(where, self._pages(candidates, 0, mark, [*patterns, *params]))
            return
        # No filter: the candidates' ids from the index's table alone, then their items rows by id; the first
        # page in one statement (most searches need no other), the rest CANDIDATE_IDS ids a statement.
        ids = (f"SELECT s.item_id FROM items_search AS s WHERE s.item_id > ? AND s.item_id < ? AND {conditions}"
               " ORDER BY s.item_id DESC LIMIT ?")
        first = self._fetch(f"SELECT {_COLUMNS} FROM ({ids}) AS c JOIN items AS i ON i.id = c.item_id"
                            " ORDER BY i.id DESC", (0, mark + 1, *patterns, min(FIRST_PAGE_ROWS, self._page_rows)))
        yield from (stored_item(row) for row in first)
        if len(first) == min(FIRST_PAGE_ROWS, self._page_rows):
            yield from self._by_ids(ids, first[-1][0] - 1, patterns)

    def _by_ids(self, sql: str, through: int, params: list[Any]) -> Iterator[StoredItem]:
        """The items whose ids `sql` gives (newest first, at or below `through`), CANDIDATE_IDS ids a statement,
        their rows read a page at a time: the index is walked, and its candidates' bodies tested, once for
        many pages (each walk costs the same however few ids it returns)."""
        before = through + 1
        while True:
            if self._interrupt():
                raise SearchInterrupted()
            ids = [int(item_id) for (item_id,) in self._fetch(sql, (0, before, *params, self._candidate_ids))]
            start, size = 0, min(FIRST_PAGE_ROWS, self._page_rows)
            while start < len(ids):
                if self._interrupt():
                    raise SearchInterrupted()
                for row in self._fetch(_ROWS_BY_ID, (ids[start : start + size],)):
                    yield stored_item(row)
                start, size = start + size, self._page_rows
            if len(ids) < self._candidate_ids:
                return
            before = ids[-1]

    def _pages(self, sql: str, above: int, through: int, params: list[Any]) -> Iterator[StoredItem]:
        before = through + 1
        size = min(FIRST_PAGE_ROWS, self._page_rows)
        while True:
            if self._interrupt():
                raise SearchInterrupted()
            page = self._fetch(sql, (above, before, *params, size))
            for row in page:
                before = row[0]
                yield stored_item(row)
            if len(page) < size:
                return
            size = self._page_rows

    @staticmethod
    def _heard(where: SearchFilter, items: Iterator[StoredItem]) -> Iterator[StoredItem]:
        """`items` that a `hears` entry takes: the SQL read a glob entry's whole connector; the glob is tested here."""
        entries = where.heard or ()
        if all(GLOB_CHARACTERS.isdisjoint(entry) for entry in entries):
            yield from items
            return
        for item in items:
            server, channel = item.metadata.get("serverId"), item.metadata.get("channelId")
            if any(_hears(entry, server, channel) for entry in entries):
                yield item

    def _fetch(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        async def fetch() -> list[tuple[Any, ...]]:
            async with self._connections.read() as conn:
                await conn.execute(_CUSTOM_PLANS)  # undone when the pool takes the connection back (RESET ALL)
                return await conn.fetch(sql, params)

        rows: list[tuple[Any, ...]] = anyio.from_thread.run(fetch)
        return rows


class IndexLookup(msgspec.Struct, frozen=True):
    """How the trigram index is asked for a query's candidates: rows holding every piece (looked up in the
    index), then the runs in their order (tested on those rows; none: the pieces are the runs); exactly, or
    ignoring ASCII case (ILIKE)."""

    pieces: tuple[str, ...]
    runs: tuple[str, ...]
    ignore_case: bool


def index_lookup(needs: Required | None) -> IndexLookup | None:
    """The lookup for a query requiring `needs`; None when the index cannot name a superset of its matches
    (nothing required; ignoring case, no run long enough where ILIKE folds as the search does).

    Ignoring case, only the runs' stretches of ASCII characters outside _FOLDS_APART are used: there the
    database's ILIKE, in any locale, folds exactly as the search's `regex` does. The pieces are the runs'
    words of WORD_MIN_CHARS or more (pg_trgm's words: letters and digits), the longest INDEX_PIECES_USED:
    looked up alone, a word's trigrams leave out the common ones a phrase's short words and the word
    boundaries bring (" th", "the", "he "), whose long posting lists cost the lookup more than they narrow.
    """
    if needs is None:
        return None
    runs = list(needs.runs)
    if needs.ignore_case:
        runs = [piece for run in runs for piece in _FOLDS_ALIKE.findall(run) if len(piece) >= INDEX_RUN_MIN_CHARS]
    if not runs:
        return None
    words = sorted({word for run in runs for word in _WORD.findall(run) if len(word) >= WORD_MIN_CHARS},
                   key=lambda word: (-len(word), word))
    pieces = tuple(words[:INDEX_PIECES_USED]) or tuple(runs)
    alone = len(runs) == 1 and pieces == tuple(runs)  # the one run is its own lookup: nothing more to test
    return IndexLookup(pieces, () if alone else tuple(runs), needs.ignore_case)


def _contains(text: str) -> str:
    """The LIKE pattern of a body containing `text`."""
    return _in_order((text,))


def _in_order(runs: Sequence[str]) -> str:
    """The LIKE pattern of a body containing `runs` one after another: a match holds its runs in the order
    `required` gives them (store/search_query.py: the concatenation's, left to right, apart)."""
    return "%" + "%".join(_LIKE_SPECIAL.sub(r"\\\g<0>", run) for run in runs) + "%"


def _hears(entry: str, server: object, channel: object) -> bool:
    """Whether a `hears` entry takes an item of `server` and `channel` (agents/context.py `heard_by`'s rule)."""
    connector, slash, channels = entry.partition("/")
    if server != connector:
        return False
    if not slash:
        return True
    if GLOB_CHARACTERS.isdisjoint(channels):
        return channel == channels
    return isinstance(channel, str) and fnmatchcase(channel, channels)


def _filter(where: SearchFilter) -> tuple[str, list[Any]]:
    """`where` as conditions on the items row `i` (a channel glob: its connector here, the glob in `_heard`)."""
    if where.heard is None:
        return filter_sql(where)
    heard: list[tuple[str, list[Any]]] = []
    for entry in where.heard:
        connector, slash, channel = entry.partition("/")
        if slash and GLOB_CHARACTERS.isdisjoint(channel):
            heard.append(("i.server_id = ? AND i.channel_id = ?", [connector, channel]))
        else:
            heard.append(("i.server_id = ?", [connector]))
    return filter_sql(where, heard=heard)
