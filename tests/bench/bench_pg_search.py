"""Search on PostgreSQL (pg_trgm) at a million items: the queries and the agent tool of bench_search_index.py.

A server from tests/postgres.py; a database migrated by the store, then loaded with tests/bench/search_corpus.py's
ITEMS items of varied chat text (the same rows, ids 1..ITEMS, as the SQLite figures) by COPY, their bodies as
searched (store/search_index.py index_text, what the indexer writes) copied into items_search, the trigram index
built after the load and the indexer's mark set past the last item: the store a caught-up daemon leaves. Then:

- queries: `mcplhost search --db URL` for a present word, a phrase, an absent word, a case-insensitive word and a
  literal regular expression, each RUNS times through the command's main function in this process (the figure is
  the time beyond the command's own start-up, which is printed too), p50 and max; hits checked against the
  planted ids. Goal: <= 100 ms.
- tool: `history_search` through an agent's ToolBox call, for an agent that hears everything, one connector of
  five, and one channel of a hundred. Goal: < 1 s.

A query that takes longer than SLOW_S runs once, and a wrong answer (a search stopped by its deadline) is
printed, not raised, so the figures after it are still measured. To measure again without a new load, keep the
server (KEEP=1 leaves it running and prints its URLs) and give the loaded database's URL (and an empty one's,
for the start-up figure):

    .venv/bin/python tests/bench/bench_pg_search.py [ITEMS]     # default 1,000,000 (the load takes minutes)
    KEEP=1 .venv/bin/python tests/bench/bench_pg_search.py 1000000
    .venv/bin/python tests/bench/bench_pg_search.py 1000000 LOADED_URL [EMPTY_URL]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio
import asyncpg

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the repository (tests.postgres), this folder (search_corpus)

from bench_search_index import QUERIES, RUNS, check, command, in_process, summary, tool_calls  # noqa: E402
from search_corpus import ABSENT_WORD, COLUMNS, _rows, bodies  # noqa: E402

from mcplhost import logs  # noqa: E402
from mcplhost.store import open_reader, open_store  # noqa: E402
from mcplhost.store.search_index import index_text  # noqa: E402
from tests.postgres import start_server  # noqa: E402

ITEMS = 1_000_000
#: Rows per COPY: the corpus is generated in Python, a chunk at a time.
CHUNK = 50_000
#: A query slower than this is run once (a full scan at a million rows takes the command's whole deadline).
SLOW_S = 10.0
#: The load's index builds may use this much memory (a GIN build with little memory spills and crawls).
BUILD_MEMORY = "512MB"


async def load(url: str, items: int) -> None:
    """The corpus into a migrated store at `url`, its search index complete; prints what each step took."""
    async with open_store(url):
        pass
    columns = ["id", *(column.strip() for column in COLUMNS.split(","))]
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f"SET maintenance_work_mem = '{BUILD_MEMORY}'")
        await conn.execute("DROP INDEX items_search_trigrams")
        started = time.perf_counter()
        texts = bodies(items)
        print(f"  corpus generated in {time.perf_counter() - started:.0f} s", flush=True)
        started = time.perf_counter()
        rows = _rows(texts)
        for first in range(1, items + 1, CHUNK):
            chunk = [(first + n, *row) for n, row in zip(range(min(CHUNK, items + 1 - first)), rows, strict=False)]
            await conn.copy_records_to_table("items", records=chunk, columns=columns)
            await conn.copy_records_to_table("items_search", columns=["item_id", "body"], records=[
                (row[0], index_text(row[4], row[5])) for row in chunk])
        await conn.execute("SELECT setval(pg_get_serial_sequence('items', 'id'), $1)", items)
        await conn.execute("UPDATE search_index SET indexed_to = $1", items)
        print(f"  {items:,} items and their bodies copied in {time.perf_counter() - started:.0f} s", flush=True)
        started = time.perf_counter()
        await conn.execute("CREATE INDEX items_search_trigrams ON items_search USING gin (body gin_trgm_ops)")
        await conn.execute("VACUUM ANALYZE")
        size = await conn.fetchval("SELECT pg_size_pretty(pg_database_size(current_database()))")
        print(f"  trigram index built and the tables analysed in {time.perf_counter() - started:.0f} s;"
              f" the database: {size}", flush=True)
    finally:
        await conn.close()


def queries(url: str, empty_url: str | None, items: int) -> None:
    if empty_url is not None:
        startup = [command(empty_url, ABSENT_WORD) for _ in range(3)]  # type: ignore[arg-type]  # a URL as --db
        print(f"  `mcplhost search` as a process over an empty store (its start-up): {summary(startup)}")
    for label, query, flags in QUERIES:
        runs = [in_process(url, query, *flags)]  # type: ignore[arg-type]
        while len(runs) < RUNS and runs[0][0] < SLOW_S:
            runs.append(in_process(url, query, *flags))  # type: ignore[arg-type]
        try:
            check(label, runs[0][1], items)
            verdict = ""
        except AssertionError:
            verdict = "; WRONG ANSWER (stopped by its deadline?)"
        print(f"  {label:>17}: {summary([seconds for seconds, _ in runs])} beyond start-up  ({len(runs[0][1])} hits;"
              f" {query!r} {' '.join(flags)}; {len(runs)} runs{verdict})", flush=True)


async def tool(url: str) -> None:
    async with open_reader(url) as store:
        await tool_calls(store)


async def migrated(url: str) -> None:
    async with open_store(url):
        pass


def measure(url: str, empty_url: str | None, items: int) -> None:
    print(f"PostgreSQL, {items:,} items; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}:", flush=True)
    print("queries (goal: <= 100 ms beyond start-up):", flush=True)
    queries(url, empty_url, items)
    print("history_search (goal: < 1 s):", flush=True)
    anyio.run(tool, url)


def main(items: int, urls: list[str]) -> None:
    if urls:  # a database loaded by an earlier run (KEEP=1)
        measure(urls[0], urls[1] if len(urls) > 1 else None, items)
        return
    server = start_server()
    try:
        database, empty = server.create_database(), server.create_database()
        anyio.run(load, database.url, items)
        anyio.run(migrated, empty.url)
        measure(database.url, empty.url, items)
    finally:
        if os.environ.get("KEEP") == "1":
            print(f"kept: {database.url} {empty.url}; stop it with: pg_ctl stop -m immediate -D {server.data}")
        else:
            server.stop()


if __name__ == "__main__":
    logs.configure(level="warning")
    main(int(sys.argv[1]) if len(sys.argv) > 1 else ITEMS, sys.argv[2:])
