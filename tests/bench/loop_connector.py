"""A connector for the speech benchmarks: answers every channels/publish, and times the whole loop when asked.

It registers one channel and answers each `channels/publish` Request with
`{delivered: true, messageId}` at once. With LOOP_ROUNDS set it also runs
the whole loop that many times, one round at a time: it sends one message
addressed to the agent, then waits for the publish that answers it, timing
item sent → publish received on its own clock (so no clocks are compared
across processes). When done it writes {"latencies_s": [...]} to LOOP_RESULT.

With LOOP_STREAMING=1 it also declares `channels.streaming` and counts the
`channels/outgoing/chunk` notifications and the characters they carry (the
result's `chunks` and `streamed_chars`).

Environment: LOOP_ROUNDS (0: only answer publishes), LOOP_RESULT (a path),
LOOP_TIMEOUT_S (per round, default 10), LOOP_STREAMING.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcplhost.connectors.mcpl_server import McplServer  # noqa: E402

CHANNEL = "bench:loop:room"
MANIFEST = {"version": "0.5", "channels": {"register": True, "incoming": True, "publish": True}}
STREAMING_MANIFEST = {"version": "0.5", "channels": {**MANIFEST["channels"], "streaming": True}}


class Chunks:
    def __init__(self) -> None:
        self.count = 0
        self.chars = 0

    async def chunk(self, params: dict[str, Any]) -> None:
        self.count += 1
        self.chars += len(params.get("delta", ""))


class Publishes:
    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.arrived: asyncio.Queue[float] = asyncio.Queue()

    async def answer(self, params: dict[str, Any]) -> dict[str, Any]:
        self.arrived.put_nowait(time.perf_counter())
        return {"delivered": True, "messageId": f"out-{next(self.ids)}"}


async def main(server: McplServer, publishes: Publishes, chunks: Chunks) -> None:
    rounds = int(os.environ.get("LOOP_ROUNDS", "0"))
    timeout = float(os.environ.get("LOOP_TIMEOUT_S", "10"))
    await server.ready.wait()
    await server.request("channels/register", {"channels": [
        {"id": CHANNEL, "type": "bench", "label": "#room", "direction": "bidirectional", "address": {}}]})
    latencies = []
    for n in range(rounds):
        sent = time.perf_counter()
        await server.request("channels/incoming", {"messages": [{
            "channelId": CHANNEL, "messageId": f"in-{n}", "author": {"id": "u1", "name": "Alice"},
            "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": f"@bot round {n}"}],
            "tags": ["chat:mention"]}]})
        arrived = await asyncio.wait_for(publishes.arrived.get(), timeout)
        latencies.append(arrived - sent)
    if rounds:
        result = {"latencies_s": latencies, "chunks": chunks.count, "streamed_chars": chunks.chars}
        Path(os.environ["LOOP_RESULT"]).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    loop_publishes, loop_chunks = Publishes(), Chunks()
    loop_server = McplServer("loop", STREAMING_MANIFEST if os.environ.get("LOOP_STREAMING") else MANIFEST)
    loop_server.handlers["channels/publish"] = loop_publishes.answer
    loop_server.notification_handlers["channels/outgoing/chunk"] = loop_chunks.chunk
    loop_server.run(lambda s: main(s, loop_publishes, loop_chunks))
