"""A connector for benchmarks: registers one channel, then sends messages as fast as the host takes them.

Environment: FLOOD_COUNT (messages), FLOOD_BATCH (messages per request),
FLOOD_INFLIGHT (requests in flight at once), FLOOD_NAME (channel prefix),
FLOOD_RESULT (a file to write {"seconds", "accepted", "started", "ended"} to when done; the last two are
wall-clock times, for comparing processes), and
optionally FLOOD_ANSWERS (a file holding every answer so far the moment it
arrives, as a JSON list of {"accepted": [messageId, ...], "refused": count},
so a test can compare what was answered with what was committed even when
the host stops mid-flood), and FLOOD_GO (a path: the flood starts once it
exists, so floods in several processes start together).
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


def replace_atomically(path: Path, text: str) -> None:
    """`path` holds `text` or what it held before, never a part: written beside it, then renamed over it."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


async def main(server: McplServer) -> None:
    count = int(os.environ["FLOOD_COUNT"])
    batch = int(os.environ["FLOOD_BATCH"])
    inflight = int(os.environ["FLOOD_INFLIGHT"])
    name = os.environ["FLOOD_NAME"]
    channel = f"bench:{name}:room"
    await server.ready.wait()
    await server.request("channels/register", {"channels": [
        {"id": channel, "type": "bench", "label": "#room", "direction": "bidirectional", "address": {}}]})

    def message(n: int) -> dict:
        return {"channelId": channel, "messageId": f"{name}-{n}", "author": {"id": "u1", "name": "Alice"},
                "timestamp": "2026-01-01T00:00:00Z",
                "content": [{"type": "text", "text": f"message {n}: the quick brown fox jumps over the lazy dog"}],
                "metadata": {"mentions": []}}

    # Requests are encoded before the clock starts, so the benchmark measures
    # the host, not this load generator's JSON encoder.
    bodies = [json.dumps({"messages": [message(n) for n in range(start, min(start + batch, count))]},
                         separators=(",", ":")) for start in range(0, count, batch)]
    accepted = 0
    queue = iter(bodies)
    answers_path = os.environ.get("FLOOD_ANSWERS")
    if answers_path:
        # Recorded in the read loop, the moment the answer's line is read (a
        # worker resumed later could be cancelled by stdin's end first). The
        # whole record is rewritten each time, to a temporary file then
        # os.replace, so a reader never sees a half-written file.
        recorded: list[dict] = []

        def record_answer(message: dict) -> None:
            results = (message.get("result") or {}).get("results") if "method" not in message else None
            if isinstance(results, list):
                recorded.append({"accepted": [r.get("messageId") for r in results if r.get("accepted")],
                                 "refused": sum(1 for r in results if not r.get("accepted"))})
                replace_atomically(Path(answers_path), json.dumps(recorded))

        server.on_message = record_answer
    go = os.environ.get("FLOOD_GO")
    while go and not os.path.exists(go):  # several hosts' floods start together once the benchmark says so
        await asyncio.sleep(0.005)
    started_at = time.time()  # wall clock, comparable across processes (bench_pg_inbound.py's hosts)
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal accepted
        for body in queue:
            answer = await server.request_encoded("channels/incoming", body, timeout=120)
            accepted += sum(1 for r in answer["results"] if r["accepted"])

    await asyncio.gather(*(worker() for _ in range(inflight)))
    seconds = time.perf_counter() - start
    Path(os.environ["FLOOD_RESULT"]).write_text(json.dumps({"seconds": seconds, "accepted": accepted,
                                                            "started": started_at, "ended": time.time()}))


if __name__ == "__main__":
    McplServer("flood", MANIFEST).run(main)
