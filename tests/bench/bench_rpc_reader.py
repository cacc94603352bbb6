"""Lines per second through the rpc reader, as a ratio to a raw pipe read + msgspec decode.

Both sides read the same bytes from a real child process's stdout pipe in
the same run. The raw side splits lines and decodes each with msgspec; the
reader side is `Session.run`: framing, envelope decode, classification and
dispatch to a handler. Goal (README.md#performance): the reader reaches at least 50% of
the raw rate.

Each side is also timed in CPU seconds of the reading thread, the ratio a
loaded machine disturbs least (time spent waiting for a core is left out).

    .venv/bin/python tests/bench/bench_rpc_reader.py [LINES]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec

from mcplhost.rpc import Session
from mcplhost.rpc.framing import LineBuffer

#: Runs of each side, interleaved; the best of each is compared (the machine is shared and noisy).
ROUNDS = 5

CAT = "import shutil, sys; shutil.copyfileobj(open(sys.argv[1], 'rb'), sys.stdout.buffer, 1 << 20)"


def make_lines(count: int, kind: str) -> bytes:
    lines = []
    for n in range(count):
        message: dict[str, Any] = {
            "jsonrpc": "2.0",
            "method": "channels/incoming",
            "params": {"messages": [{
                "channelId": "discord:g1:room", "messageId": f"m-{n}",
                "author": {"id": "u1", "name": "Alice"}, "timestamp": "2026-01-01T00:00:00Z",
                "content": [{"type": "text", "text": f"message number {n} with a little text"}],
            }]},
        }
        if kind == "requests":
            message["id"] = n
        lines.append(json.dumps(message, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


async def raw(path: Path) -> tuple[int, float, float]:
    decode = msgspec.json.decode
    count = 0
    start, cpu = time.perf_counter(), time.thread_time()
    async with await anyio.open_process([sys.executable, "-c", CAT, str(path)], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        buffer = LineBuffer()
        async for chunk in proc.stdout:
            for line in buffer.feed(chunk):
                decode(line)
                count += 1
    return count, time.perf_counter() - start, time.thread_time() - cpu


async def reader(path: Path) -> tuple[int, float, float]:
    count = 0

    async def on_notification(method: str, params: Any) -> None:
        nonlocal count
        count += 1

    async def on_request(method: str, params: Any) -> Any:
        nonlocal count
        count += 1
        return {}

    class Sink:  # responses go nowhere: we measure reading, not the child's stdin
        async def send(self, data: bytes) -> None:
            pass

    start, cpu = time.perf_counter(), time.thread_time()
    async with await anyio.open_process([sys.executable, "-c", CAT, str(path)], stdout=subprocess.PIPE) as proc:
        session = Session(Sink(), proc.stdout, on_request=on_request, on_notification=on_notification)  # type: ignore[arg-type]
        await session.run()
    return count, time.perf_counter() - start, time.thread_time() - cpu


async def main(lines: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        for kind in ("notifications", "requests"):
            path = Path(folder) / f"{kind}.jsonl"
            path.write_bytes(make_lines(lines, kind))
            best_raw = best_reader = cpu_raw = cpu_reader = 0.0
            for _ in range(ROUNDS):  # interleaved, best of each: the machine is noisy
                n, seconds, cpu = await raw(path)
                best_raw, cpu_raw = max(best_raw, n / seconds), max(cpu_raw, n / cpu)
                n2, seconds2, cpu2 = await reader(path)
                assert n2 == n == lines
                best_reader, cpu_reader = max(best_reader, n2 / seconds2), max(cpu_reader, n2 / cpu2)
            size = path.stat().st_size / lines
            print(f"{kind:>13}: raw pipe+decode {best_raw:>10,.0f} lines/s | rpc reader {best_reader:>10,.0f} lines/s"
                  f" | ratio {best_reader / best_raw:.0%}  ({lines:,} lines of ~{size:.0f} B)")
            # Per CPU second of the reading thread: the same ratio, steadier on a shared machine (a wait for
            # the CPU is not counted on either side).
            print(f"{'':>13}  per CPU second: raw {cpu_raw:>10,.0f} lines | rpc reader {cpu_reader:>10,.0f} lines"
                  f" | ratio {cpu_reader / cpu_raw:.0%}")


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
