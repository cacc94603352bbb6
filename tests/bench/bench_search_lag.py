"""Event-loop lag while searching, and the time to find the newest hits, before and after the worker-thread search.

"Before" is the scan this replaced, kept below as `search_on_the_loop`: on
the event loop, oldest first through the whole table, REGEX_TIMEOUT_S per
item and no overall deadline. "After" is `mcplhost.store.readers.search_items`: a
worker thread, newest first, stopping at the limit, one deadline. Both run
in the same process over the same files, with tests/bench/looplag.py
sampling the loop every 5 ms.

1. a pathological history_search: `(a|aa)+$` over PATHOLOGICAL_ROWS rows of
   a's ending in b (each row runs out of REGEX_TIMEOUT_S), through the tool;
2. a plain search of a large table: a literal that matches nothing, over ITEMS items;
3. the newest 5 of ITEMS items that all match.

Goal: loop lag max under 50 ms during a search.

    .venv/bin/python tests/bench/bench_search_lag.py [ITEMS]
"""

from __future__ import annotations

import json
import sqlite3
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import anyio
from looplag import LoopLagProbe  # beside this file: the script's folder is on sys.path

from mcplhost import logs
from mcplhost.agents.model import ToolCall
from mcplhost.agents.tools.toolbox import ToolBox
from mcplhost.config import AgentConfig
from mcplhost.store import Store, open_store
from mcplhost.store.readers import REGEX_TIMEOUT_S, body_text, compile_query, search_items

PATHOLOGICAL = r"(a|aa)+$"
PATHOLOGICAL_BODY = "a" * 60 + "b"
PATHOLOGICAL_ROWS = 10
NEWEST = 5
COLUMNS = ("agent, participant, role, content, metadata, server_id, channel_id, message_id, thread_id,"
           " conversation_id, dedup_digest, created_at")


def seed(path: Path, bodies: Any) -> None:
    """Rows straight into the migrated file, one transaction (seeding is not what is measured)."""
    conn = sqlite3.connect(path, isolation_level=None)
    metadata = json.dumps({"serverId": "disc", "channelId": "disc:g1:room"})
    conn.execute("BEGIN")
    conn.executemany(f"INSERT INTO items ({COLUMNS}) VALUES (NULL, 'Alice', 'user', ?, ?, 'disc', 'disc:g1:room',"
                     " NULL, NULL, 'conv', NULL, ?)",
                     ((json.dumps([{"type": "text", "text": body}]), metadata, n) for n, body in enumerate(bodies)))
    conn.execute("COMMIT")
    conn.close()


async def search_on_the_loop(store: Store, query: str, *, as_regex: bool, limit: int) -> list[int]:
    """The search before this change: on the loop, oldest first, the whole table, a window of the newest hits."""
    pattern = compile_query(query, as_regex=as_regex, ignore_case=False)
    window: deque[int] = deque(maxlen=limit)
    async for item in store.items.iterate():
        try:
            match = pattern.search(body_text(item.content, item.meta.source_header), timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            continue
        if match is not None:
            window.append(item.id)
    return list(reversed(window))


async def measured(label: str, work: Any) -> None:
    async with LoopLagProbe() as probe:
        await anyio.sleep(2 * probe.interval_s)  # the probe is asleep, due, before the work starts...
        started = time.perf_counter()
        outcome = await work()
        took = time.perf_counter() - started
        await anyio.sleep(2 * probe.interval_s)  # ...and records the stall the work caused, if any
    print(f"{label:<58} {took:>7.2f} s | {probe.summary()} | {outcome}")


async def main(items: int) -> None:
    logs.configure("json", "warning")
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        async with open_store(folder / "slow.db") as store:
            seed(folder / "slow.db", ["hello"] + [PATHOLOGICAL_BODY] * PATHOLOGICAL_ROWS)
            box = ToolBox(AgentConfig(name="scout"), {}, store)
            call = ToolCall(id="c", name="history_search", arguments={"query": PATHOLOGICAL, "regex": True})

            async def tool() -> str:
                answer = json.loads((await box.call(call)).blocks[0]["text"])
                return f"{len(answer['hits'])} hits, {answer.get('timedOut', 0)} timed out"

            async def before() -> str:
                return f"{len(await search_on_the_loop(store, PATHOLOGICAL, as_regex=True, limit=20))} hits"

            print(f"1. pathological regex over {PATHOLOGICAL_ROWS} rows")
            await measured("   before: on the loop", before)
            await measured("   after: history_search in a worker thread", tool)

        async with open_store(folder / "big.db") as store:
            seed(folder / "big.db", (f"needle {n} and some words of an ordinary message" for n in range(items)))

            async def plain_after() -> str:
                found = await search_items(store, "absent", limit=NEWEST)
                return f"{found.searched:,} searched, stopped early: {found.stopped_early}"

            async def plain_before() -> str:
                return f"{len(await search_on_the_loop(store, 'absent', as_regex=False, limit=NEWEST))} hits"

            async def newest_after() -> str:
                found = await search_items(store, "needle", limit=NEWEST)
                return f"ids {[hit['id'] for hit in found.hits]}, {found.searched} searched"

            async def newest_before() -> str:
                return f"ids {await search_on_the_loop(store, 'needle', as_regex=False, limit=NEWEST)}"

            print(f"2. a literal matching none of {items:,} items")
            await measured("   before: on the loop", plain_before)
            await measured("   after: worker thread", plain_after)
            print(f"3. the newest {NEWEST} of {items:,} matching items")
            await measured("   before: on the loop, whole table", newest_before)
            await measured("   after: worker thread, newest first", newest_after)


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 500_000)
