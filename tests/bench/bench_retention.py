"""Benchmark retention: how fast a pass prunes, and how long an inbound commit waits while it runs.

Seeds N old items (default 200,000, ~300 bytes of body each) and 2,000 new
ones, then measures one-item commits through the GroupWriter (one message
per request, the slowest inbound shape) first alone, then while a
retention pass deletes the old items in its batches (store/retention.py
RETENTION_BATCH_ROWS). Prints the pass's rate, its longest batch, and the
commits' p50/p99/max in both phases.

Run: .venv/bin/python tests/bench/bench_retention.py [N]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

from mcplhost.store import NewItem, open_store
from mcplhost.store.retention import DAY_MS, RETENTION_BATCH_ROWS
from mcplhost.store.writer import GroupWriter

OLD_ITEMS = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
NOW = int(time.time() * 1000)


def item(n: int, created_at: int) -> NewItem:
    return NewItem(role="user", content=[{"type": "text", "text": f"message {n} " + "x" * 300}],
                   metadata={"serverId": "disc", "channelId": "disc:g1:a", "messageId": f"m-{n}"},
                   created_at=created_at, participant="Alice")


def summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[int(len(ordered) * 0.99) - 1] if len(ordered) >= 100 else ordered[-1]
    return (f"{len(ordered)} commits, p50 {statistics.median(ordered) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms,"
            f" max {ordered[-1] * 1000:.2f} ms")


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        async with open_store(Path(folder) / "bench.db") as store:
            for start in range(0, OLD_ITEMS, 10_000):
                await store.items.insert_many([item(n, NOW - 30 * DAY_MS)
                                               for n in range(start, min(OLD_ITEMS, start + 10_000))])
            await store.items.insert_many([item(OLD_ITEMS + n, NOW) for n in range(2000)])
            writer = GroupWriter(store)
            batch_times: list[float] = []
            real_batch = store.retention.prune_batch

            async def timed_batch(**kwargs):
                began = time.perf_counter()
                try:
                    return await real_batch(**kwargs)
                finally:
                    batch_times.append(time.perf_counter() - began)

            store.retention.prune_batch = timed_batch  # type: ignore[method-assign]

            async def commits(until: anyio.Event | None, count: int, first: int) -> list[float]:
                latencies: list[float] = []
                n = first
                while (until is None and len(latencies) < count) or (until is not None and not until.is_set()):
                    began = time.perf_counter()
                    await writer.store_items([item(n, NOW)])
                    latencies.append(time.perf_counter() - began)
                    n += 1
                return latencies

            async with anyio.create_task_group() as tg:
                await tg.start(writer.run)
                alone = await commits(None, 2000, 10**9)
                done = anyio.Event()
                result: dict[str, float] = {}

                async def prune() -> None:
                    began = time.perf_counter()
                    counts = await store.retention.prune(retention_days=7, agents=(), context_rows=2000, now_ms=NOW)
                    result["seconds"] = time.perf_counter() - began
                    result["removed"] = counts.removed
                    done.set()

                tg.start_soon(prune)
                during = await commits(done, 0, 2 * 10**9)
                tg.cancel_scope.cancel()
    print(f"retention pass: {result['removed']:.0f} items removed in {result['seconds']:.2f} s"
          f" ({result['removed'] / result['seconds']:,.0f} items/s), {len(batch_times)} batches of"
          f" {RETENTION_BATCH_ROWS}, longest batch {max(batch_times) * 1000:.1f} ms,"
          f" p50 {statistics.median(batch_times) * 1000:.1f} ms")
    print(f"one-item commits alone:        {summary(alone)}")
    print(f"one-item commits during pass:  {summary(during)}")


if __name__ == "__main__":
    anyio.run(main)
