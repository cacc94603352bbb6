"""A connector for the index-lag benchmark: one message per request at a steady rate, some carrying a probe word.

Environment: PACED_RATE (messages per second), PACED_SECONDS, PACED_PROBE_EVERY (every N-th message holds
the word `probe<N>x`), PACED_ACKS (a file: one line `{"word", "acked"}` per probe message, written the
moment its request is answered, i.e. after the host committed it; `acked` is time.time()).
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
CHANNEL = "paced:g1:room"


async def main(server: McplServer) -> None:
    rate = float(os.environ["PACED_RATE"])
    count = int(rate * float(os.environ["PACED_SECONDS"]))
    every = int(os.environ["PACED_PROBE_EVERY"])
    acks = open(os.environ["PACED_ACKS"], "a", buffering=1)  # noqa: SIM115 (open for the whole run)
    await server.ready.wait()
    await server.request("channels/register", {"channels": [
        {"id": CHANNEL, "type": "bench", "label": "#room", "direction": "bidirectional", "address": {}}]})

    async def send(n: int) -> None:
        word = f"probe{n}x" if n % every == 0 else "chatter"
        await server.request("channels/incoming", {"messages": [{
            "channelId": CHANNEL, "messageId": f"m-{n}", "author": {"id": "u1", "name": "Alice"},
            "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": f"message {n} {word}"}]}]},
            timeout=120)
        if n % every == 0:
            acks.write(json.dumps({"word": word, "acked": time.time()}) + "\n")

    started = time.perf_counter()
    tasks = []
    for n in range(count):
        tasks.append(asyncio.ensure_future(send(n)))
        await asyncio.sleep(max(0.0, started + (n + 1) / rate - time.perf_counter()))
    await asyncio.gather(*tasks)
    acks.write(json.dumps({"done": time.perf_counter() - started}) + "\n")


if __name__ == "__main__":
    McplServer("paced", MANIFEST).run(main)
