"""Loop lag while a real child feeds 100,000 hostile lines through the real session and connection.

The child writes a seeded mix of junk: random bytes, params nested 2,000
deep, 256 KiB strings, combs nested just under the bound, wrong types, stray
responses, unknown methods, invalid UTF-8, and well-formed requests the
connection refuses (it never completes its handshake). It drains its stdin,
so the host's answers flow. A neighbour child is pinged throughout on the
same loop. tests/bench/looplag.py measures the loop; goal: max stall under 50 ms.

    .venv/bin/python tests/bench/bench_fuzz_lag.py [LINES]
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcplhost.config import ConnectorConfig  # noqa: E402
from mcplhost.protocol.connection import McplConnection  # noqa: E402
from mcplhost.rpc import Session  # noqa: E402
from mcplhost.rpc.limits import MAX_NESTING_DEPTH  # noqa: E402
from tests.bench.looplag import LoopLagProbe  # noqa: E402

# Copies the file to stdout in 64 KiB writes while a thread drains stdin (the host's answers).
FEED = """
import shutil, sys, threading
threading.Thread(target=lambda: shutil.copyfileobj(sys.stdin.buffer, open('/dev/null', 'wb')), daemon=True).start()
shutil.copyfileobj(open(sys.argv[1], 'rb'), sys.stdout.buffer, 1 << 16)
sys.stdout.flush()
"""
ECHO = """
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if "id" in m and "method" in m:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {}}) + "\\n"); sys.stdout.flush()
"""
HUGE_STRING = 256 * 1024


def hostile_line(rng: random.Random, n: int) -> bytes:
    kind = rng.random()
    if kind < 0.15:
        return b"#" + bytes(rng.randrange(256) for _ in range(rng.randrange(200))).replace(b"\n", b" ")
    if kind < 0.25:
        deep = "[" * 2000 + "]" * 2000
        head = f'{{"jsonrpc":"2.0","id":{n},' if rng.random() < 0.5 else '{"jsonrpc":"2.0",'
        return f'{head}"method":"channels/incoming","params":{deep}}}'.encode()
    if kind < 0.252:
        return json.dumps({"jsonrpc": "2.0", "id": n, "method": "push/event",
                           "params": {"text": "x" * HUGE_STRING}}).encode()
    if kind < 0.27:
        comb = ("[" * (MAX_NESTING_DEPTH - 3) + "]" * (MAX_NESTING_DEPTH - 3) + ",") * 200 + "0"
        return f'{{"jsonrpc":"2.0","id":{n},"method":"channels/register","params":[{comb}]}}'.encode()
    if kind < 0.40:
        wrong = rng.choice([{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"},
                            {"jsonrpc": "2.0", "id": n, "method": 7},
                            {"jsonrpc": "1.0", "id": n, "method": "ping"},
                            {"jsonrpc": "2.0", "id": n, "method": "channels/incoming", "params": "nope"},
                            {"jsonrpc": "2.0", "id": True, "method": "ping"}, [1, 2, 3], "str", 12])
        return json.dumps(wrong).encode()
    if kind < 0.55:
        stray = rng.choice([{"jsonrpc": "2.0", "id": rng.randrange(10**6), "result": {}},
                            {"jsonrpc": "2.0", "id": n, "error": {"code": "x"}},
                            {"jsonrpc": "2.0", "id": None, "error": {"code": -1, "message": "m"}}])
        return json.dumps(stray).encode()
    if kind < 0.70:
        method = f"unknown/{rng.randrange(10**6)}"
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": {"k": n}}
        if rng.random() < 0.5:
            message["id"] = n
        return json.dumps(message).encode()
    if kind < 0.75:
        return b'{"jsonrpc":"2.0","id":%d,"method":"ping","params":{"s":"\xff\xfe\xc3"}}' % n
    return json.dumps({"jsonrpc": "2.0", "id": n, "method": "channels/incoming", "params": {"messages": [{
        "channelId": "x:1", "messageId": f"m-{n}", "author": {"id": "u"}, "timestamp": "2026-01-01T00:00:00Z",
        "content": [{"type": "text", "text": "hi"}]}]}}).encode()


async def main(lines: int) -> None:
    structlog.configure(logger_factory=structlog.WriteLoggerFactory(open(os.devnull, "w")),  # noqa: SIM115
                        processors=[structlog.processors.JSONRenderer()])
    rng = random.Random(13)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "hostile.jsonl"
        with path.open("wb") as out:
            for n in range(lines):
                out.write(hostile_line(rng, n) + b"\n")
        size = path.stat().st_size
        spec = ConnectorConfig(name="hostile", command=["feed"])
        log = structlog.get_logger().bind(connector="hostile")
        pings: list[float] = []
        async with await anyio.open_process([sys.executable, "-c", FEED, str(path)], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE) as feed, \
                await anyio.open_process([sys.executable, "-c", ECHO], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE) as echo:
            session = Session(feed.stdin, feed.stdout, log=log)  # type: ignore[arg-type]
            connection = McplConnection(spec, session, intake=None, log=log)  # type: ignore[arg-type]  # never ready
            neighbour = Session(echo.stdin, echo.stdout)  # type: ignore[arg-type]
            start = time.perf_counter()
            async with LoopLagProbe() as probe, anyio.create_task_group() as tg:
                tg.start_soon(neighbour.run)
                done = anyio.Event()

                async def ping() -> None:
                    while not done.is_set():
                        sent = time.perf_counter()
                        await neighbour.request("ping", timeout=5)
                        pings.append(time.perf_counter() - sent)
                        await anyio.sleep(0.01)

                tg.start_soon(ping)
                await session.run()
                seconds = time.perf_counter() - start
                done.set()
                tg.cancel_scope.cancel()
            echo.kill()
            connection.close_jobs()
    stats = session.statistics()
    print(f"{lines:,} hostile lines ({size / 2**20:.0f} MiB) in {seconds:.1f} s ({lines / seconds:,.0f} lines/s)")
    print(probe.summary())
    print(f"neighbour: {len(pings)} pings answered, max round trip {max(pings) * 1000:.1f} ms")
    print("session:", {k: v for k, v in stats.items() if v})


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
