"""The store's write and read rates on PostgreSQL against SQLite, through the same code: figures for README.md.

One run, both engines, on this machine: a server from tests/postgres.py (a Unix socket, fsync off as in
the tests; `synchronous_commit = off`), SQLite in a temporary folder with its default synchronous =
NORMAL. Figures (each the best of ROUNDS):

- inbound: channel items (with their redelivery key) through the group writer, WRITERS concurrent
  submitters of one item each, so groups form as they do under load: items/s;
- two hosts: the same on PostgreSQL from two stores (two pools) at once, the order lock serializing
  their item-storing commits: items/s together, and the ratio to one host;
- catch-up read: `items.after` pages of 1,000 over what was written: rows/s.

Compare the ratios within one run (the machine is shared).

    .venv/bin/python tests/bench/bench_pg_store.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcplhost.store import NewItem, Store, open_store  # noqa: E402
from mcplhost.store.operations import InsertItems  # noqa: E402
from mcplhost.store.writer import GroupWriter  # noqa: E402
from tests.postgres import start_server  # noqa: E402

ITEMS = 4000
WRITERS = 64
ROUNDS = 3


def item(n: int, host: str) -> NewItem:
    return NewItem(role="user", content=[{"type": "text", "text": f"[source: bench / #room] message {n}"}],
                   metadata={"serverId": "bench", "channelId": "bench:room", "messageId": f"{host}-{n}", "tags": []},
                   created_at=1_790_000_000_000 + n, participant="Alice", dedup_digest=f"digest-{host}-{n}")


async def inbound(store: Store, host: str, count: int) -> None:
    writer = GroupWriter(store)
    async with anyio.create_task_group() as tg:
        await tg.start(writer.run)
        numbers = iter(range(count))

        async def submitter() -> None:
            for n in numbers:
                await writer.write(InsertItems([item(n, host)]))

        async with anyio.create_task_group() as submitters:
            for _ in range(WRITERS):
                submitters.start_soon(submitter)
        tg.cancel_scope.cancel()


async def rates(targets: list[str | Path], label: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for _ in range(ROUNDS):
        async with open_store(targets[0]) as first:
            started = time.perf_counter()
            await inbound(first, f"{label}-{time.perf_counter_ns()}", ITEMS)
            found["inbound"] = max(found.get("inbound", 0.0), ITEMS / (time.perf_counter() - started))
            started, cursor, read = time.perf_counter(), 0, 0
            while rows := await first.items.after(cursor, limit=1000):
                cursor, read = rows[-1].id, read + len(rows)
            found["read"] = max(found.get("read", 0.0), read / (time.perf_counter() - started))
            if len(targets) > 1:
                async with open_store(targets[1]) as second:
                    started = time.perf_counter()
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(inbound, first, f"a-{time.perf_counter_ns()}", ITEMS)
                        tg.start_soon(inbound, second, f"b-{time.perf_counter_ns()}", ITEMS)
                    found["two hosts"] = max(found.get("two hosts", 0.0), 2 * ITEMS / (time.perf_counter() - started))
    return found


async def main() -> None:
    server = start_server()
    try:
        database = server.create_database()
        with tempfile.TemporaryDirectory() as folder:
            sqlite = await rates([Path(folder) / "bench.db"], "s")
        pg = await rates([database.url, database.url], "p")
    finally:
        server.stop()
    print(f"{'inbound, items/s':>24}: SQLite {sqlite['inbound']:>8,.0f} | PostgreSQL {pg['inbound']:>8,.0f}"
          f" | ratio {pg['inbound'] / sqlite['inbound']:.2f}")
    print(f"{'two hosts, items/s':>24}: PostgreSQL {pg['two hosts']:>8,.0f}"
          f" | ratio to one host {pg['two hosts'] / pg['inbound']:.2f}")
    print(f"{'catch-up read, rows/s':>24}: SQLite {sqlite['read']:>8,.0f} | PostgreSQL {pg['read']:>8,.0f}"
          f" | ratio {pg['read'] / sqlite['read']:.2f}")


if __name__ == "__main__":
    anyio.run(main)
