"""Inbound on PostgreSQL through the whole path, and two hosts against one: figures for README.md.

On a server from tests/postgres.py (a Unix socket; fsync and synchronous_commit off, as in the tests), one run:

- path: tests/bench/bench_inbound_path.py's workloads (flood_connector.py through the host in this process, with
  `[store] url`): batches of 50 messages per request from one connector, and one message per request from 4
  connectors; items/s against a plain batched insert of the same rows (asyncpg executemany, 50 rows per
  transaction) into a table with the items table's columns and no index, in the same database. Goal: >= 25%.
- hosts: one `mcplhost run` process with two flood connectors, against two `mcplhost run` processes on the same
  database with one of them each (every host a process of its own, as in production): combined items/s from the
  first connector's start to the last one's end, and the ratio. Goal: >= 1.6x. On a machine with fewer free cores
  than the two hosts, the connectors and the server need, the ratio says how much the store serializes, not how
  far hosts scale: print the machine's load beside it.

Each figure is the best of ROUNDS, rounds interleaved; compare ratios within one run (the machine is shared).

    .venv/bin/python tests/bench/bench_pg_inbound.py [ITEMS] [path|hosts ...]    # ITEMS per workload, default 20,000
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import anyio
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mcplhost.host  # noqa: E402
from mcplhost import logs  # noqa: E402
from mcplhost.config import Config, ConnectorConfig, HostConfig, StoreConfig  # noqa: E402
from tests.bench.bench_inbound_path import connector  # noqa: E402
from tests.cli.support import daemon, toml_table  # noqa: E402
from tests.postgres import PostgresServer, start_server  # noqa: E402

ITEMS = 20_000
ROUNDS = 2
#: The plain insert's transaction size: the batches of the path's first workload.
PLAIN_BATCH = 50
#: Connectors per host in the hosts part, and their shape (batches of 50, 8 requests in flight each).
HOST_BATCH, HOST_INFLIGHT = 50, 8


async def run_host(url: str, folder: Path, connectors: list[ConnectorConfig]) -> tuple[float, int]:
    """The host in this process on `url` until every connector reports: the slowest one's seconds, items accepted."""
    config = Config(store=StoreConfig(url=url, state_dir=str(folder)), host=HostConfig(name="bench"),
                    connectors=connectors)
    stop = anyio.Event()
    results = [folder / f"{c.name}.json" for c in connectors]
    async with mcplhost.host.open_host(config) as host, anyio.create_task_group() as tg:
        tg.start_soon(host.run, stop)
        with anyio.fail_after(600):
            while not all(p.exists() for p in results):
                await anyio.sleep(0.05)
        stop.set()
    reports = [json.loads(p.read_text()) for p in results]
    return max(r["seconds"] for r in reports), sum(r["accepted"] for r in reports)


async def plain_insert(url: str) -> float:
    """Rows/s of a batched insert (PLAIN_BATCH per transaction) of the items the host stored, ids included, into a
    table of the same columns (CREATE TABLE … LIKE items: no key, no index), over one connection."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("DROP TABLE IF EXISTS plain_items; CREATE TABLE plain_items (LIKE items)")
        columns = [r["column_name"] for r in await conn.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'items' ORDER BY ordinal_position")]
        names = ", ".join(columns)
        rows = await conn.fetch(f"SELECT {names} FROM items ORDER BY id")
        insert = f"INSERT INTO plain_items ({names}) VALUES ({', '.join(f'${n + 1}' for n in range(len(columns)))})"
        started = time.perf_counter()
        for offset in range(0, len(rows), PLAIN_BATCH):
            async with conn.transaction():
                await conn.executemany(insert, rows[offset: offset + PLAIN_BATCH])
        return len(rows) / (time.perf_counter() - started)
    finally:
        await conn.close()


async def path(server: PostgresServer, items: int) -> None:
    for label, count, batch, inflight in (("batches of 50, 1 connector", 1, 50, 8),
                                          ("1 message per request, 4 connectors", 4, 1, 64)):
        rate = plain = 0.0
        for _ in range(ROUNDS):
            database = server.create_database()
            with tempfile.TemporaryDirectory() as name:
                folder = Path(name)
                per = items // count
                seconds, accepted = await run_host(database.url, folder, [
                    connector(f"c{n}", folder, per, batch, inflight) for n in range(count)])
                assert accepted == per * count, f"only {accepted} items were accepted"
                rate = max(rate, accepted / seconds)
                plain = max(plain, await plain_insert(database.url))
        print(f"{label:>38}: {rate:>8,.0f} items/s | plain batched insert (50 a transaction, no index)"
              f" {plain:>8,.0f} rows/s | ratio {rate / plain:.0%}  (best of {ROUNDS}, {items:,} items)", flush=True)


def host_file(folder: Path, url: str, name: str, connectors: list[ConnectorConfig]) -> Path:
    """`mcplhost run`'s config for host `name` with these flood connectors; its state in folder/name."""
    (folder / name).mkdir()
    text = f'[store]\nurl = "{url}"\n[host]\nname = "{name}"\n'
    for spec in connectors:
        text += "\n" + toml_table("[[connectors]]", {
            "name": spec.name, "command": spec.command, "env": spec.env, "grant": spec.grant,
            "restart": {"policy": "never"}, "request_timeout_s": 60})
    path = folder / name / "mcplhost.toml"
    path.write_text(text, encoding="utf-8")
    return path


async def hosts_run(url: str, folder: Path, layout: list[list[str]], per: int) -> float:
    """Hosts as `mcplhost run` processes, host n running the connectors named in layout[n]: combined items/s from
    the first flood's start to the last one's end."""
    go = folder / "go"
    configs = [host_file(folder, url, f"h{n}", [flooding(name, folder, per, go) for name in names])
               for n, names in enumerate(layout)]
    names = [name for names in layout for name in names]
    async with daemon(configs[0], folder) as first:
        await first.wait_event("host.ready", timeout=120)  # the first host migrates the new database
        if len(configs) == 1:
            return await finished(folder, names, [first], go)
        async with daemon(configs[1], folder) as second:
            await second.wait_event("host.ready", timeout=120)
            return await finished(folder, names, [first, second], go)


def flooding(name: str, folder: Path, count: int, go: Path) -> ConnectorConfig:
    """A flood connector that starts when `go` exists."""
    spec = connector(name, folder, count, HOST_BATCH, HOST_INFLIGHT)
    return ConnectorConfig(name=spec.name, command=spec.command, env={**spec.env, "FLOOD_GO": str(go)},
                           grant=spec.grant)


async def finished(folder: Path, names: list[str], runs: list, go: Path) -> float:
    go.touch()  # every host is ready, its connectors up: the floods start together
    results = [folder / f"{name}.json" for name in names]
    with anyio.fail_after(600):
        while not all(p.exists() for p in results):
            await anyio.sleep(0.05)
    for run in runs:
        run.signal(signal.SIGTERM)
        await run.wait(timeout=60)
    reports = [json.loads(p.read_text()) for p in results]
    assert all(r["accepted"] for r in reports), reports
    span = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    return sum(r["accepted"] for r in reports) / span


async def hosts(server: PostgresServer, items: int) -> None:
    one = two = 0.0
    per = items // 2
    for _ in range(ROUNDS):
        for layout in ([["a", "b"]], [["a"], ["b"]]):
            database = server.create_database()
            with tempfile.TemporaryDirectory() as name:
                rate = await hosts_run(database.url, Path(name), layout, per)
            if len(layout) == 1:
                one = max(one, rate)
            else:
                two = max(two, rate)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{'two connectors, one host':>38}: {one:>8,.0f} items/s\n"
          f"{'one connector on each of two hosts':>38}: {two:>8,.0f} items/s | ratio {two / one:.2f}x"
          f"  (best of {ROUNDS}, {per * 2:,} items; {os.cpu_count()} cores, load average {load})", flush=True)


PARTS = {"path": path, "hosts": hosts}


async def main(items: int, parts: list[str]) -> None:
    server = start_server()
    try:
        for part in parts:
            await PARTS[part](server, items)
    finally:
        server.stop()


if __name__ == "__main__":
    logs.configure(level="warning")
    arguments = sys.argv[1:]
    count = int(arguments.pop(0)) if arguments and arguments[0].isdigit() else ITEMS
    anyio.run(main, count, arguments or list(PARTS))
