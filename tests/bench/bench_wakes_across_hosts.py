"""How soon an agent hears an item another host stored (docs/operations.md#several-hosts-on-one-store): figures for
README.md.

Two hosts in this process on one PostgreSQL database (tests/postgres.py's server): host A stores one channel item
at a time through its ingest; host B runs an agent woken by every item. The figure is the time from A's commit
to the item reaching B's agents (offered to its scheduler), ITEMS times, median and max:

- by NOTIFY (the poll set to an hour, so only the notification can bring it in time);
- by the poll alone (nothing LISTENs), for comparison: about POLL_S / 2 on average, at most POLL_S.

    .venv/bin/python tests/bench/bench_wakes_across_hosts.py
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcplhost.agents import follow  # noqa: E402
from mcplhost.ingest import Stored  # noqa: E402
from mcplhost.store.hosts import Sharing  # noqa: E402
from tests.agents.test_shared_agents import host_config, store_items  # noqa: E402
from tests.harness import running_host  # noqa: E402
from tests.postgres import start_server  # noqa: E402

ITEMS = 20


async def latencies(url: str, folder: Path) -> list[float]:
    async with running_host(host_config(url, "a", folder)) as a, \
            running_host(host_config(url, "b", folder, "scout")) as b:
        follower = b.agents.dispatcher.follower
        assert follower is not None
        offered = follower._offer
        arrived: dict[int, float] = {}
        seen = anyio.Event()

        def timed(event: Stored) -> None:
            arrived[event.id] = time.monotonic()
            seen.set()
            offered(event)

        follower._offer = timed
        took = []
        for _ in range(ITEMS):
            seen = anyio.Event()
            started = time.monotonic()
            await store_items(a.ingest, 1)
            with anyio.fail_after(10):
                await seen.wait()
            took.append(max(arrived.values()) - started)
        return took


async def deaf(self: Sharing, channel: str, heard: Callable[[str], None]) -> None:
    return None


async def main() -> None:
    server = start_server()
    try:
        for name in ("notify", "poll"):
            if name == "notify":
                follow.POLL_S = 3600.0
            else:
                follow.POLL_S = 1.0
                Sharing.listen = deaf  # type: ignore[method-assign]
            with tempfile.TemporaryDirectory() as folder:
                took = await latencies(server.create_database().url, Path(folder))
            print(json.dumps({"by": name, "items": ITEMS, "median_ms": round(statistics.median(took) * 1000, 1),
                              "max_ms": round(max(took) * 1000, 1)}))
    finally:
        server.stop()


if __name__ == "__main__":
    anyio.run(main)
