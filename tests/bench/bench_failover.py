"""Failover on a shared PostgreSQL store: from kill -9 of a connector's owner to the standby's connector serving.

Two `mcplhost run` processes (tests/cli/support.py's `daemon`) on one database of a server from
tests/postgres.py, both configured for one scripted connector; host a owns it, host b stands by
(store/hosts.py: it tries the ownership lock every RETRY_S). Each round kills a with SIGKILL and times
until b's log says the connector serves (`connector.mcp_only`), polled every 20 ms. Prints each round
and the median, in seconds. The bound the tests hold it to is 10 s.

    .venv/bin/python tests/bench/bench_failover.py
"""

from __future__ import annotations

import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.cli.support import daemon, scripted_connector, toml_table  # noqa: E402
from tests.postgres import start_server  # noqa: E402

ROUNDS = 3


def write_config(folder: Path, url: str, name: str) -> Path:
    folder.mkdir()
    connector = toml_table("[[connectors]]", scripted_connector("chat", {}, folder))
    path = folder / "mcplhost.toml"
    path.write_text(f'[store]\nurl = "{url}"\npool_size = 2\n[host]\nname = "{name}"\n\n{connector}')
    return path


async def one_round(url: str, folder: Path) -> float:
    a_config, b_config = write_config(folder / "a", url, "a"), write_config(folder / "b", url, "b")
    async with daemon(a_config, folder) as a:
        await a.wait_event("hosts.connector_owned", host="a")
        async with daemon(b_config, folder) as b:
            await b.wait_event("host.ready")
            started = time.monotonic()
            a.signal(signal.SIGKILL)
            await b.wait_event("connector.mcp_only", timeout=30)
            took = time.monotonic() - started
            b.signal(signal.SIGTERM)
            await b.wait()
    return took


async def main() -> None:
    server = start_server()
    try:
        rounds = []
        for number in range(ROUNDS):
            database = server.create_database()
            with tempfile.TemporaryDirectory() as folder:
                rounds.append(await one_round(database.url, Path(folder)))
            print(json.dumps({"round": number, "failover_s": round(rounds[-1], 3)}))
        print(json.dumps({"failover_s_median": round(statistics.median(rounds), 3), "rounds": ROUNDS}))
    finally:
        server.stop()


if __name__ == "__main__":
    anyio.run(main)
