"""The cost of one `/metrics` scrape with 50 connectors and 10,000 registered channels (README.md#performance).

Goal: under 20 ms. A real host is built over a real store (build_host, with
`[metrics] listen` on a free loopback port) and its metrics served on the
event loop as `run` serves them; each of the 50 connector handles gets a
connection (no process behind it: the scrape never talks to a connector)
with 200 registered channels, and every counter family is filled with
label sets as a busy host has them (items, refusals by method and reason,
suppressed lines, publishes). Each scrape is a real HTTP round trip over
TCP: connect, GET /metrics, read the whole answer, which includes reading
the pending outbox count from SQLite. Printed: the median and the 95th
percentile of SCRAPES scrapes, and the body's size.

    .venv/bin/python tests/bench/bench_metrics.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcplhost.config import Config, ConnectorConfig, MetricsConfig, StoreConfig  # noqa: E402
from mcplhost.host import build_host  # noqa: E402
from mcplhost.metrics import bound_address  # noqa: E402
from mcplhost.protocol.connection import McplConnection  # noqa: E402
from mcplhost.store import open_store  # noqa: E402
from tests.harness import descriptor, gone_session, http_exchange  # noqa: E402

CONNECTORS = 50
CHANNELS_PER_CONNECTOR = 200  # 10,000 in all
SCRAPES = 200
GOAL_MS = 20.0
SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n"


async def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only
    with tempfile.TemporaryDirectory() as folder:
        specs = [ConnectorConfig(name=f"c{i:02d}", command=["true"], grant=["channels.register"])
                 for i in range(CONNECTORS)]
        config = Config(store=StoreConfig(path=str(Path(folder) / "bench.db")), connectors=specs,
                        metrics=MetricsConfig(listen="127.0.0.1:0"))
        async with open_store(config.store.path) as store:
            host = build_host(config, store)
            assert host.metrics is not None
            for n, (name, handle) in enumerate(host.connectors.items()):
                connection = McplConnection(handle.spec, gone_session(), host.ingest, structlog.get_logger())
                connection.registry.add([descriptor(f"{name}:ch{j}") for j in range(CHANNELS_PER_CONNECTOR)])
                handle.life.spawned(10_000 + n, connection)
                for lane in ("channels/incoming", "push/event"):
                    handle.refusals.item(lane, 3)  # (the accepted and duplicate series are there, at 0)
                for method, code in (("push/event", -32002), ("channels/incoming", -32602), ("(unknown)", -32601)):
                    handle.refusals.request(method, code)
                for event in ("mcpl.refused", "mcpl.push", "rpc.junk_line"):
                    handle.suppressed.add(name, event)
            listener = await host.metrics.listen(config.metrics.listen)
            address = bound_address(listener)
            async with anyio.create_task_group() as tg:
                tg.start_soon(host.metrics.serve, listener)
                body = await http_exchange(address, SCRAPE)
                times = []
                for _ in range(SCRAPES):
                    began = time.perf_counter()
                    await http_exchange(address, SCRAPE)
                    times.append((time.perf_counter() - began) * 1000)
                tg.cancel_scope.cancel()
    times.sort()
    median, p95 = statistics.median(times), times[int(len(times) * 0.95)]
    print(f"scrape with {CONNECTORS} connectors and {CONNECTORS * CHANNELS_PER_CONNECTOR:,} channels: "
          f"median {median:.2f} ms, p95 {p95:.2f} ms over {SCRAPES} scrapes (goal < {GOAL_MS:g} ms); "
          f"body {len(body):,} bytes")


if __name__ == "__main__":
    anyio.run(main)
