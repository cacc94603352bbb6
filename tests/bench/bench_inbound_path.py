"""The whole inbound path, connector to committed row, through real subprocesses.

Two workloads, each as items/s and as a ratio to a plain batched SQLite
insert of the same rows (sqlite3 executemany, 50 rows per transaction,
same schema and pragmas) measured in the same run:

- batches of 50 messages per channels/incoming request, one connector;
- one message per request, from 4 connectors at once (commits grouped
  across concurrent requests; each item is still acknowledged only after
  its commit).

Goals (issue 4): >= 20,000 items/s and >= 25% of the plain-insert rate in
batches of 50; >= 5,000 items/s for one message per request.

    .venv/bin/python tests/bench/bench_inbound_path.py [ITEMS]
"""

from __future__ import annotations

import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import anyio

from mcplhost import logs
from mcplhost.config import Config, ConnectorConfig, RestartConfig, StoreConfig
from mcplhost.host import Host

HERE = Path(__file__).resolve().parent
#: Runs per workload; the best host rate and the best plain rate are compared.
ROUNDS = 2


def connector(name: str, folder: Path, count: int, batch: int, inflight: int) -> ConnectorConfig:
    return ConnectorConfig(
        name=name,
        command=[sys.executable, str(HERE / "flood_connector.py")],
        env={"FLOOD_COUNT": str(count), "FLOOD_BATCH": str(batch), "FLOOD_INFLIGHT": str(inflight),
             "FLOOD_NAME": name, "FLOOD_RESULT": str(folder / f"{name}.json")},
        grant=["channels.register", "channels.incoming"],
        restart=RestartConfig(policy="never"),
        request_timeout_s=60,
    )


async def run_host(folder: Path, connectors: list[ConnectorConfig]) -> tuple[float, int]:
    """Run the host until every connector reports; return the slowest connector's seconds and items accepted."""
    config = Config(store=StoreConfig(path=str(folder / "host.db")), connectors=connectors)
    host = Host(config)
    stop = anyio.Event()
    results = [folder / f"{c.name}.json" for c in connectors]
    async with anyio.create_task_group() as tg:
        tg.start_soon(host.run, stop)
        with anyio.fail_after(600):
            while not all(p.exists() for p in results):
                await anyio.sleep(0.05)
        stop.set()
    reports = [json.loads(p.read_text()) for p in results]
    return max(r["seconds"] for r in reports), sum(r["accepted"] for r in reports)


def plain_insert(rows_db: Path, folder: Path) -> float:
    """Rows/s of a plain batched insert of the rows the host stored (50 per transaction), same columns and indexes."""
    source = sqlite3.connect(rows_db)
    columns = ("agent, participant, role, content, metadata, server_id, channel_id, message_id, thread_id,"
               " conversation_id, dedup_digest, created_at")
    rows = source.execute(f"SELECT {columns} FROM items ORDER BY id").fetchall()
    schema = [r[0] for r in source.execute("SELECT sql FROM sqlite_master WHERE name LIKE 'items%' AND sql IS NOT NULL")]
    source.close()
    target = sqlite3.connect(folder / "plain.db", isolation_level=None)
    target.execute("PRAGMA journal_mode = WAL")
    target.execute("PRAGMA synchronous = NORMAL")
    for statement in schema:
        target.execute(statement)
    insert = f"INSERT INTO items ({columns}) VALUES ({', '.join('?' * 12)})"
    start = time.perf_counter()
    for offset in range(0, len(rows), 50):
        target.execute("BEGIN")
        target.executemany(insert, rows[offset : offset + 50])
        target.execute("COMMIT")
    seconds = time.perf_counter() - start
    target.close()
    return len(rows) / seconds


async def main(items: int) -> None:
    logs.configure("json", "warning")  # as `mcplhost run` configures it, quieter
    for label, connectors_count, batch, inflight in (
        ("batches of 50, 1 connector", 1, 50, 8),
        ("1 message per request, 4 connectors", 4, 1, 64),
    ):
        rate = plain = 0.0
        for _ in range(ROUNDS):  # interleaved, best of each: the machine is noisy
            with tempfile.TemporaryDirectory() as name:
                folder = Path(name)
                per = items // connectors_count
                specs = [connector(f"c{i}", folder, per, batch, inflight) for i in range(connectors_count)]
                seconds, accepted = await run_host(folder, specs)
                assert accepted == per * connectors_count, f"only {accepted} items were accepted"
                rate = max(rate, accepted / seconds)
                plain = max(plain, plain_insert(folder / "host.db", folder))
        print(f"{label:>38}: {rate:>9,.0f} items/s | plain batched insert {plain:>9,.0f} rows/s"
              f" | ratio {rate / plain:.0%}  ({accepted:,} items, best of {ROUNDS})")


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 40_000)
