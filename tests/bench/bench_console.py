"""What the web console costs the inbound path: throughput with pages being served and one open live feed, vs without.

The inbound workload of bench_inbound_path.py's second part (one message per
channels/incoming request, from CONNECTORS flood connectors at once, real
subprocesses, a real store), run in alternating rounds:

- without a console (`[console]` not set);
- with the console on a loopback port, one client reading the live feed
  (/feed/events, every line the feed sends while the flood runs) and one
  loading a page every PAGE_INTERVAL_S (the overview, the feed, the messages
  list, an item with its explain, the turns), as an operator watching it.

Printed: each variant's median items/s over the rounds, the ratio of the
medians (with the console / without), and the spread of the rounds without
as the noise to read it against; also the pages served and feed lines read.
Goal (docs/operations.md#console): a ratio within the noise.

    .venv/bin/python tests/bench/bench_console.py [ITEMS] [ROUNDS]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcplhost.cli.serve import console_lines  # noqa: E402
from mcplhost.config import Config, ConnectorConfig, ConsoleConfig, RestartConfig, StoreConfig  # noqa: E402
from mcplhost.host import Host, open_host  # noqa: E402
from tests.harness import http_exchange  # noqa: E402

HERE = Path(__file__).resolve().parent
ITEMS = 20_000
ROUNDS = 4
CONNECTORS = 4
INFLIGHT = 64  # requests in flight per connector
#: An operator clicking through the console twice a second.
PAGE_INTERVAL_S = 0.5
PAGES = ["/", "/feed", "/items", "/items/1", "/turns"]


def connector(name: str, folder: Path, count: int) -> ConnectorConfig:
    return ConnectorConfig(
        name=name, command=[sys.executable, str(HERE / "flood_connector.py")],
        env={"FLOOD_COUNT": str(count), "FLOOD_BATCH": "1", "FLOOD_INFLIGHT": str(INFLIGHT), "FLOOD_NAME": name,
             "FLOOD_RESULT": str(folder / f"{name}.json")},
        grant=["channels.register", "channels.incoming"], restart=RestartConfig(policy="never"), request_timeout_s=60)


async def read_feed(address: str, lines: list[int]) -> None:
    """One live-feed client: reads the event stream as it comes and counts its lines."""
    async with await anyio.connect_tcp(*address.rsplit(":", 1)) as stream:  # type: ignore[arg-type]
        await stream.send(f"GET /feed/events HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
        while True:
            lines[0] += (await stream.receive()).count(b"\nevent: line\n")


async def load_pages(address: str, served: list[int]) -> None:
    """One operator: a page every PAGE_INTERVAL_S, round the pages."""
    while True:
        for page in PAGES:
            started = time.perf_counter()
            answer = await http_exchange(address, f"GET {page} HTTP/1.1\r\nHost: {address}\r\n"
                                         "Connection: close\r\n\r\n".encode(), timeout=30)
            # /items/1 is 404 until the flood's first item is stored; every other page is 200 throughout.
            assert answer.startswith(b"HTTP/1.1 200") or page == "/items/1", answer[:200]
            served[0] += 1
            await anyio.sleep(max(0.0, PAGE_INTERVAL_S - (time.perf_counter() - started)))


async def one_round(items: int, *, console: bool, served: list[int], lines: list[int]) -> float:
    """Items/s of one flood, with or without the console being watched."""
    with tempfile.TemporaryDirectory() as run:
        folder = Path(run)
        connectors = [connector(f"c{i}", folder, items // CONNECTORS) for i in range(CONNECTORS)]
        config = Config(store=StoreConfig(path=str(folder / "host.db")), connectors=connectors,
                        console=ConsoleConfig(listen="127.0.0.1:0") if console else ConsoleConfig())
        results = [folder / f"{c.name}.json" for c in connectors]
        stop = anyio.Event()
        async with open_host(config, feed_format=console_lines() if console else None) as host, \
                anyio.create_task_group() as tg:
            tg.start_soon(host.run, stop)
            async with anyio.create_task_group() as watching:
                if console:
                    watching.start_soon(watch, host, served, lines)
                with anyio.fail_after(600):
                    while not all(p.exists() for p in results):
                        await anyio.sleep(0.05)
                watching.cancel_scope.cancel()
            stop.set()
        reports = [json.loads(p.read_text()) for p in results]
    return sum(r["accepted"] for r in reports) / max(r["seconds"] for r in reports)


async def watch(host: Host, served: list[int], lines: list[int]) -> None:
    assert host.console is not None and host.console.address is not None
    async with anyio.create_task_group() as tg:
        tg.start_soon(read_feed, host.console.address, lines)
        tg.start_soon(load_pages, host.console.address, served)


async def main(items: int, rounds: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only
    without, with_console = [], []
    served, lines = [0], [0]
    for _ in range(rounds):
        without.append(await one_round(items, console=False, served=served, lines=lines))
        with_console.append(await one_round(items, console=True, served=served, lines=lines))
    plain, watched = statistics.median(without), statistics.median(with_console)
    spread = (max(without) - min(without)) / plain
    print(f"inbound, one message per request, {CONNECTORS} connectors, {items:,} items, {rounds} rounds each:")
    print(f"  without a console: median {plain:,.0f} items/s (rounds {', '.join(f'{r:,.0f}' for r in without)})")
    print(f"  console watched:   median {watched:,.0f} items/s (rounds {', '.join(f'{r:,.0f}' for r in with_console)})")
    print(f"  ratio {watched / plain:.3f} (the rounds without spread {spread:.1%}); {served[0]} pages served, "
          f"{lines[0]:,} feed lines read")


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else ITEMS, int(sys.argv[2]) if len(sys.argv) > 2 else ROUNDS)
