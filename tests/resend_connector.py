"""A connector that floods push/event and, in each new life, re-sends what it was not sure was stored.

    python -m tests.resend_connector        (cwd or PYTHONPATH: the repository)

What the real connectors do after a restart or on another host: a push whose
answer never came is sent again with the same eventId (the host deduplicates
on it, docs/connectors.md), and a few of the last answered ones are sent
again too (an answer can be lost after it was written). The state that
outlives a life is one file, RESEND_ACKED: one eventId per line, appended
the moment its `accepted: true` answer is read, so every life (on this host
or, for a connector two hosts share, on the standby) knows what was
acknowledged before it.

Environment:
    RESEND_COUNT     pushes in the whole flood (eventIds e-0 … e-(COUNT-1))
    RESEND_INFLIGHT  requests in flight at once
    RESEND_AGAIN     the last this-many acknowledged eventIds a new life sends again
    RESEND_ACKED     the file of acknowledged eventIds (shared by every life)
    RESEND_GO        a path: the flood starts once it exists (the test says when)
    RESEND_DONE      a path written when a life has had an answer to each of its pushes:
                     {"pid", "sent", "again", "refused"}
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from mcplhost.connectors.mcpl_server import McplServer, RemoteError

#: Pushes need a feature set that uses them (harness.CHAT_MANIFEST, not imported: a connector starts light).
MANIFEST = {"version": "0.5", "pushEvents": True,
            "featureSets": {"chat": {"description": "alerts", "uses": ["pushEvents"]}}}
#: How often a life looks for RESEND_GO before the flood (the connector's own wait, not the test's).
GO_POLL_S = 0.01


def acknowledged(path: Path) -> list[str]:
    """The eventIds acknowledged so far, in order (a line still being written is left out)."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    return text[: text.rfind("\n") + 1].split()


def push(event_id: str) -> dict[str, Any]:
    return {"featureSet": "chat", "eventId": event_id, "timestamp": "2026-01-01T00:00:00Z",
            "payload": {"content": [{"type": "text", "text": f"alert {event_id}: disk usage above 90%"}]}}


async def main(server: McplServer) -> None:
    count, inflight = int(os.environ["RESEND_COUNT"]), int(os.environ["RESEND_INFLIGHT"])
    again = int(os.environ["RESEND_AGAIN"])
    acked_path, go, done = (Path(os.environ[name]) for name in ("RESEND_ACKED", "RESEND_GO", "RESEND_DONE"))
    await server.ready.wait()
    while not go.exists():
        await asyncio.sleep(GO_POLL_S)
    before = acknowledged(acked_path)
    known = set(before)
    todo = [f"e-{n}" for n in range(count) if f"e-{n}" not in known] + before[len(before) - again:] * bool(again)
    # An ack is appended by the read loop as its line is read (a worker resumed later could be cancelled by
    # stdin's end first); one short write to an O_APPEND file, so lives never interleave within a line.
    asked: dict[Any, str] = {}
    acked_fd = os.open(acked_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def on_send(message: dict[str, Any]) -> None:
        if message.get("method") == "push/event":
            asked[message["id"]] = message["params"]["eventId"]

    def on_message(message: dict[str, Any]) -> None:
        event_id = asked.pop(message.get("id"), None) if "method" not in message else None
        if event_id is not None and (message.get("result") or {}).get("accepted") is True:
            os.write(acked_fd, f"{event_id}\n".encode())

    server.on_send, server.on_message = on_send, on_message
    queue, refused = iter(todo), 0

    async def worker() -> None:
        nonlocal refused
        for event_id in queue:
            try:
                answer = await server.request("push/event", push(event_id), timeout=60)
            except RemoteError:
                refused += 1
            else:
                refused += answer.get("accepted") is not True

    await asyncio.gather(*(worker() for _ in range(inflight)))
    done.write_text(json.dumps({"pid": os.getpid(), "sent": len(todo), "again": min(again, len(before)),
                                "refused": refused}))


if __name__ == "__main__":
    McplServer("resend", MANIFEST).run(main)
