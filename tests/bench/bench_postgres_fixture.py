"""What the PostgreSQL fixture (tests/postgres.py) costs the suite: a server's start and stop, and a fresh database.

Figures, each the median of ROUNDS rounds, wall time and the CPU time of the
server's processes and the commands (children's user + system time):

- start alone: initdb + pg_ctl start (a serial run);
- three starts at once, as `pytest -n 3` does when each worker needs a
  server;
- a fresh database, once per test that asks for one (CREATE DATABASE …
  TEMPLATE template0 and the previous test's drop, one psql run);
- stop (pg_ctl stop -m immediate and the folder's removal).

Goal: the start small against the suite's 150 s (a few seconds of wall time at most, across all workers).

    .venv/bin/python tests/bench/bench_postgres_fixture.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.postgres import PostgresServer, start_server  # noqa: E402

ROUNDS = 5
DATABASES = 20
T = TypeVar("T")


def children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def measured(action: Callable[[], T]) -> tuple[T, float, float]:
    """`action`'s result, wall seconds and children's CPU seconds (waited-for processes only)."""
    wall, cpu = time.perf_counter(), children_cpu()
    result = action()
    return result, time.perf_counter() - wall, children_cpu() - cpu


def line(label: str, walls: list[float], cpus: list[float]) -> None:
    print(f"{label:<44} wall {statistics.median(walls) * 1000:7.0f} ms   cpu {statistics.median(cpus) * 1000:6.0f} ms"
          f"   (wall min {min(walls) * 1000:.0f}, max {max(walls) * 1000:.0f})")


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {ROUNDS} rounds")
    starts: list[tuple[float, float]] = []
    stops: list[tuple[float, float]] = []
    creates: list[tuple[float, float]] = []
    for _ in range(ROUNDS):
        server, wall, cpu = measured(start_server)
        starts.append((wall, cpu))
        for _ in range(DATABASES // ROUNDS):
            database, wall, cpu = measured(server.create_database)
            server.finish(database)
            creates.append((wall, cpu))
        _, wall, cpu = measured(server.stop)
        stops.append((wall, cpu))
    parallel: list[tuple[float, float]] = []
    for _ in range(ROUNDS):
        wall, cpu = time.perf_counter(), children_cpu()
        with ThreadPoolExecutor(3) as pool:
            servers: list[PostgresServer] = list(pool.map(lambda _: start_server(), range(3)))
        parallel.append((time.perf_counter() - wall, children_cpu() - cpu))
        for server in servers:
            server.stop()
    for label, figures in (("start alone (initdb + pg_ctl start)", starts),
                           ("three starts at once (-n 3)", parallel),
                           ("fresh database (create + previous drop)", creates), ("stop", stops)):
        line(label, [w for w, _ in figures], [c for _, c in figures])


if __name__ == "__main__":
    main()
