"""A search's reads on SQLite, in its worker thread: the rows above the index's mark, then the index's candidates.

`IndexReader.newest_first` gives the items a search tests, newest first, each once, from one snapshot of
the mark and the newest id:

1. every item above the mark (not indexed yet: a few, or most of a store whose index is being built),
   read row by row;
2. then, when the query requires strings of 3 or more characters (store/search_query.py `required`),
   the indexed items that hold the rarest few of their trigrams (`rarest`: each probed on its newest
   rows; a common trigram costs the lookup more than it narrows); otherwise every item at or below the
   mark, row by row, as before the index. The candidates are a superset of the matches; the search tests
   each against its own row's text.

The filter (`SearchFilter`) is part of each statement's WHERE, so rows it excludes are never decoded, and
each condition is answered from an index: a connector's rows through items_by_server, an exact channel
through items_by_channel, `--since` from the lowest id items_by_time gives (`since_floor`). With several
`hears` entries, each has its own statement and the rows are merged here, newest first. Each statement
reads one page of SEARCH_PAGE_ROWS rows and ends before the next begins, so WAL checkpoints go on; rows are
decoded one at a time. A statement that runs long (a filter that excludes most of the candidates) is
stopped by SQLite's progress handler, which the caller sets (`SearchInterrupted`).
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Generator, Iterator
from fnmatch import fnmatchcase
from itertools import product
from typing import Any

from mcplhost.store.items import STORED_COLUMNS, StoredItem, stored_item
from mcplhost.store.search_query import Required, SearchFilter

#: Rows per statement (each ends before the next, so WAL checkpoints go on).
SEARCH_PAGE_ROWS = 200
#: Trigrams of a query whose frequency is probed at most (spread over its runs).
INDEX_TERMS_PROBED = 12
#: Trigrams one index lookup asks for at most: the rarest of those probed. Each more narrows the candidates, but
#: the index walks every one of them; a common trigram costs a lookup more than it saves.
INDEX_TERMS_USED = 4
#: A probe reads at most this many of a trigram's newest rows to tell how common it is.
INDEX_PROBE_ROWS = 64
#: A trigram in more than this share of the newest rows is not worth walking, but for the rarest one.
INDEX_TERM_SHARE_MAX = 0.3
#: `--since` looks through at most this many of the newest items by time for the lowest id it can start from.
SINCE_FLOOR_ROWS = 20_000
#: The SQL function a `hears` channel glob is matched with (fnmatchcase, exactly as the rule says).
GLOB_FUNCTION = "mcplhost_fnmatch"
#: ASCII characters that `regex` matches, ignoring case, with a character SQLite's trigram tokenizer does not
#: fold to the same one ("i" and "İ", "I" and "ı"): a trigram holding one is looked up in each form.
FOLD_VARIANTS = {"i": ("i", "İ", "ı"), "I": ("i", "İ", "ı")}
GLOB_CHARACTERS = frozenset("*?[")
_COLUMNS = ", ".join(f"i.{column}" for column in STORED_COLUMNS)


class SearchInterrupted(Exception):
    """The caller's progress handler stopped a statement (its deadline passed, or it was cancelled)."""


def fts_terms(needs: Required, most: int = INDEX_TERMS_PROBED) -> list[str]:
    """One FTS5 term per distinct trigram of the runs (at most `most`, spread over them): every body holding
    the runs satisfies each. Ignoring case, a trigram is asked for in each form FOLD_VARIANTS gives."""
    trigrams = list(dict.fromkeys(run[i : i + 3] for run in needs.runs for i in range(len(run) - 2)))
    if len(trigrams) > most:
        last = len(trigrams) - 1
        trigrams = list(dict.fromkeys(trigrams[round(k * last / (most - 1))] for k in range(most)))
    terms = []
    for trigram in trigrams:
        forms = (["".join(chars) for chars in product(*(FOLD_VARIANTS.get(ch, ch) for ch in trigram))]
                 if needs.ignore_case else [trigram])
        quoted = " OR ".join('"' + form.replace('"', '""') + '"' for form in forms)
        terms.append(f"({quoted})" if len(forms) > 1 else quoted)
    return terms


def heard_conditions(heard: tuple[str, ...]) -> list[tuple[str, list[Any]]]:
    """One condition on the items row `i` per `hears` entry (the rule of agents/hearing.py `heard_by`), each one an
    index answers: items_by_server for a connector (and a channel glob, matched by GLOB_FUNCTION), items_by_channel
    for an exact channel (`+` keeps SQLite from taking items_by_server for it)."""
    conditions: list[tuple[str, list[Any]]] = []
    for entry in heard:
        connector, slash, glob = entry.partition("/")
        if not slash:
            conditions.append(("i.server_id = ?", [connector]))
        elif GLOB_CHARACTERS.isdisjoint(glob):
            conditions.append(("+i.server_id = ? AND i.channel_id = ?", [connector, glob]))
        else:
            conditions.append((f"i.server_id = ? AND i.channel_id IS NOT NULL AND {GLOB_FUNCTION}(i.channel_id, ?)",
                               [connector, glob]))
    return conditions


def filter_sql(where: SearchFilter, *, heard: list[tuple[str, list[Any]]] | None = None) -> tuple[str, list[Any]]:
    """`where` as conditions on the items row `i`, and their parameters; `heard`: the conditions (ORed) that stand
    for `where.heard` (default: all of `heard_conditions`; one of them, or another engine's own)."""
    clauses: list[str] = []
    params: list[Any] = []
    if where.heard is not None:
        clauses.append("i.agent IS NULL")
        entries = heard if heard is not None else heard_conditions(where.heard)
        if entries:
            clauses.append("(" + " OR ".join(f"({sql})" for sql, _ in entries) + ")")
            params.extend(value for _, values in entries for value in values)
    if where.channel is not None:
        clauses.append("i.channel_id = ?")
        params.append(where.channel)
    if where.since_ms is not None:
        clauses.append("i.created_at >= ?")
        params.append(where.since_ms)
    return " AND ".join(clauses) or "TRUE", params


class IndexReader:
    """One search's reads over a plain sqlite3 connection of its worker thread (db.connect_read_only)."""

    def __init__(self, conn: sqlite3.Connection, *, page_rows: int = SEARCH_PAGE_ROWS) -> None:
        self._conn = conn
        self._page_rows = page_rows
        conn.create_function(GLOB_FUNCTION, 2, _fnmatch, deterministic=True)

    def close(self) -> None:
        self._conn.close()

    def bounds(self) -> tuple[int, int]:
        """(the mark, the newest id), from one snapshot; the mark never above the newest id."""
        ((mark, newest),) = self._run(
            "SELECT (SELECT indexed_to FROM search_index), (SELECT coalesce(max(id), 0) FROM items)", ())
        return min(mark, newest), newest

    def newest_first(self, needs: Required | None, where: SearchFilter) -> Generator[StoredItem, None, None]:
        """The items to test for a query requiring `needs` (None: nothing the index can use), newest first."""
        mark, newest = self.bounds()
        floor = self.since_floor(where.since_ms) if where.since_ms is not None else 0
        if needs is None:
            yield from self.rows(where, above=floor, through=newest)
            return
        yield from self.rows(where, above=max(mark, floor), through=newest)
        if mark > floor:
            yield from self.candidates(needs, where, above=floor, through=mark)

    def since_floor(self, since_ms: int) -> int:
        """An id below every item created at or after `since_ms`, found through items_by_time when fewer than
        SINCE_FLOOR_ROWS items are (else 0: the condition alone then keeps the older ones out)."""
        ((count, lowest, newest),) = self._run(
            "SELECT count(*), min(id), (SELECT coalesce(max(id), 0) FROM items) FROM (SELECT id FROM items"
            " INDEXED BY items_by_time WHERE created_at >= ? LIMIT ?)", (since_ms, SINCE_FLOOR_ROWS))
        if count == 0:
            return int(newest)
        return int(lowest) - 1 if count < SINCE_FLOOR_ROWS else 0

    def rows(self, where: SearchFilter, *, above: int, through: int) -> Iterator[StoredItem]:
        """Every item `where` takes with an id in (above, through], newest first.

        With `hears` entries, one statement per entry, each on its own index, merged here by id: SQLite would
        answer their OR by collecting every matching row and sorting them, on every page.
        """
        entries = heard_conditions(where.heard) if where.heard else [None]
        streams = [self._pages(f"SELECT {_COLUMNS} FROM items AS i WHERE i.id > ? AND i.id < ? AND {condition}"
                               " ORDER BY i.id DESC LIMIT ?", [above], params, through)
                   for condition, params in (filter_sql(where, heard=None if entry is None else [entry]) for entry in entries)]
        if len(streams) == 1:
            yield from streams[0]
            return
        last = None
        for item in heapq.merge(*streams, key=_newest_first):
            if item.id != last:  # an item two entries hear comes from both
                last = item.id
                yield item

    def candidates(self, needs: Required, where: SearchFilter, *, above: int, through: int) -> Iterator[StoredItem]:
        """The indexed items with an id in (above, through] that `where` takes and that hold the rarest few of
        `needs`' trigrams (`rarest`): a superset of those whose body holds the runs."""
        condition, params = filter_sql(where)
        match = " AND ".join(self.rarest(fts_terms(needs), through))
        # CROSS JOIN keeps the index outermost, newest first; each candidate's row is found by its id.
        yield from self._pages(f"SELECT {_COLUMNS} FROM items_search CROSS JOIN items AS i ON i.id = items_search.rowid"
                               " WHERE items_search MATCH ? AND items_search.rowid > ? AND items_search.rowid < ? AND"
                               f" {condition} ORDER BY items_search.rowid DESC LIMIT ?",
                               [match, above], params, through)

    def rarest(self, terms: list[str], through: int) -> list[str]:
        """The INDEX_TERMS_USED rarest of `terms` among the indexed rows at or below `through` (the rarest one
        always; the others only while they are in at most INDEX_TERM_SHARE_MAX of the rows).

        How common each is comes from its newest INDEX_PROBE_ROWS rows: the ids they span. A term absent from
        the index is rarest of all, and the lookup finds nothing at once.
        """
        if len(terms) <= 1:
            return terms
        shares: list[tuple[float, int, str]] = []
        for position, term in enumerate(terms):
            ((count, oldest),) = self._run(
                "SELECT count(*), min(rowid) FROM (SELECT rowid FROM items_search WHERE items_search MATCH ?"
                " AND rowid <= ? ORDER BY rowid DESC LIMIT ?)", (term, through, INDEX_PROBE_ROWS))
            if count == 0:
                return [term]
            spanned = through - oldest + 1 if count >= INDEX_PROBE_ROWS else max(through, 1)
            shares.append((count / spanned, position, term))
        shares.sort()
        chosen = [shares[0]] + [share for share in shares[1:INDEX_TERMS_USED] if share[0] <= INDEX_TERM_SHARE_MAX]
        return [term for _, _, term in sorted(chosen, key=lambda share: share[1])]

    def _pages(self, sql: str, head: list[Any], params: list[Any], through: int) -> Iterator[StoredItem]:
        """Run `sql` (parameters: head, the exclusive upper id, params, the page size) a page at a time."""
        before = through + 1
        while True:
            cursor = self._cursor(sql, (*head, before, *params, self._page_rows))
            taken = 0
            try:
                while True:
                    try:
                        row = cursor.fetchone()
                    except sqlite3.OperationalError as exc:
                        raise _interrupted(exc) from None
                    if row is None:
                        break
                    taken += 1
                    before = row[0]
                    yield stored_item(row)
            finally:
                cursor.close()
            if taken < self._page_rows:
                return

    def _cursor(self, sql: str, params: tuple[Any, ...]) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, params)
        except sqlite3.OperationalError as exc:
            raise _interrupted(exc) from None

    def _run(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        cursor = self._cursor(sql, params)
        try:
            return cursor.fetchall()
        except sqlite3.OperationalError as exc:
            raise _interrupted(exc) from None
        finally:
            cursor.close()


def _newest_first(item: StoredItem) -> int:
    return -item.id


def _interrupted(exc: sqlite3.OperationalError) -> Exception:
    return SearchInterrupted() if "interrupt" in str(exc) else exc


def _fnmatch(channel: object, glob: str) -> bool:
    return isinstance(channel, str) and fnmatchcase(channel, glob)
