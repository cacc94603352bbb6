"""A hostile connector for the log-flood test and benchmark: stray responses and refused notifications.

Once its policy has arrived it writes HOSTILE_STRAY responses to ids the host
never used and HOSTILE_REFUSED `channels/incoming` notifications (refused
when its grant lacks `channels.incoming`, as with an empty grant), in large
writes, then a `ping` request: the host handles lines in order, so the ping's
answer means every hostile line has been read. It then writes
{"seconds": ..., "hostile": ...} to HOSTILE_RESULT and serves until stdin ends.

With HOSTILE_ROUNDS (default 1) it pings that many times, each round first
writing HOSTILE_STDERR lines of 2,000 characters to its stderr (which the
host logs as `connector.stderr`) and then sleeping HOSTILE_ROUND_S: a steady
stream of host log lines, and a ping answered per round ("pings" in the result).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcplhost.connectors.mcpl_server import McplServer  # noqa: E402

MANIFEST = {"version": "0.5", "channels": {"register": True, "incoming": True}}
#: Hostile lines per write.
CHUNK_LINES = 1000
#: The characters of one stderr line (the host cuts its `connector.stderr` lines at 2,000).
STDERR_LINE = "E" * 2000 + "\n"


def hostile_lines(stray: int, refused: int) -> list[bytes]:
    """Stray responses (ids from 10**9 up, never the host's) interleaved with refused notifications."""
    lines = []
    for n in range(max(stray, refused)):
        if n < stray:
            lines.append(b'{"jsonrpc":"2.0","id":%d,"result":{}}\n' % (10**9 + n))
        if n < refused:
            lines.append(b'{"jsonrpc":"2.0","method":"channels/incoming","params":{"messages":[]}}\n')
    return lines


async def main(server: McplServer) -> None:
    stray, refused = int(os.environ["HOSTILE_STRAY"]), int(os.environ["HOSTILE_REFUSED"])
    lines = hostile_lines(stray, refused)
    await server.ready.wait()
    start = time.perf_counter()
    out = sys.stdout.buffer
    for at in range(0, len(lines), CHUNK_LINES):
        out.write(b"".join(lines[at:at + CHUNK_LINES]))
        out.flush()
    rounds, stderr_lines = int(os.environ.get("HOSTILE_ROUNDS", "1")), int(os.environ.get("HOSTILE_STDERR", "0"))
    round_s = float(os.environ.get("HOSTILE_ROUND_S", "0"))
    pings = 0
    for _ in range(rounds):
        sys.stderr.write(STDERR_LINE * stderr_lines)
        sys.stderr.flush()
        await server.request("ping", timeout=120)
        pings += 1
        await asyncio.sleep(round_s)
    seconds = time.perf_counter() - start
    result = Path(os.environ["HOSTILE_RESULT"])
    partial = result.with_name(result.name + ".tmp")
    partial.write_text(json.dumps({"seconds": seconds, "hostile": len(lines), "pings": pings}))
    os.replace(partial, result)  # whole or absent: the test polls for this file while it is written


if __name__ == "__main__":
    McplServer("hostile", MANIFEST).run(main)
