"""A connector that behaves like heartbeat-mcpl on the wire (MCPL 0.4, see docs/mcpl-compat.md).

It announces version "0.4", declares its feature set in the 0.4 array form
(with `uses: ["tools"]` although it pushes), answers `featureSets/update`
with -32601, and sends a `push/event` every interval with
`origin.source = "heartbeat"`. Settings (environment):

    HEARTBEAT_INTERVAL_S   seconds between heartbeats              (default 30)
    HEARTBEAT_COUNT        stop after this many, 0 = forever       (default 0)
    HEARTBEAT_QUIRKS       comma list of other deployed habits:
                           "banner"       print a non-JSON line on stdout first
                           "host_command" send discord's unknown host/command request

Test-only: MCPL_TEST_CLOCK runs the heartbeats on a test's clock
(mcpl_server.py `timed_steps`); what is pushed stays the same.
"""

from __future__ import annotations

import itertools
import os
import random
import string
import sys
import time

from .mcpl_server import McplServer, RemoteError, log, text, timed_steps

MANIFEST = {
    "version": "0.4",
    "pushEvents": True,
    "featureSets": [
        {"name": "heartbeat", "description": "Periodic heartbeat and reminders", "uses": ["tools"],
         "rollback": False, "hostState": False},
    ],
}


async def refuse_policy(params: dict) -> None:
    raise RemoteError({"code": -32601, "message": "Method not found"})


async def main(server: McplServer) -> None:
    interval = float(os.environ.get("HEARTBEAT_INTERVAL_S", "30"))
    count = int(os.environ.get("HEARTBEAT_COUNT", "0"))
    quirks = set(filter(None, os.environ.get("HEARTBEAT_QUIRKS", "").split(",")))
    await server.initialized.wait()  # 0.4 servers do not wait for a policy
    if "host_command" in quirks:
        try:
            await server.request("host/command", {"command": "status"})
        except RemoteError as exc:
            log(f"heartbeat: host/command refused as expected: {exc}")
    async with timed_steps() as steps:
        for n in itertools.count(1):
            if count and n > count:
                break
            await steps.after(interval)
            await beat(server, n)


async def beat(server: McplServer, n: int) -> None:
    now = int(time.time() * 1000)
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
    try:
        answer = await server.request("push/event", {
            "featureSet": "heartbeat",
            "eventId": f"heartbeat_{now}_{suffix}",
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "origin": {"source": "heartbeat", "sequence": n},
            "payload": {"content": text(f"Heartbeat {n}: all quiet.")},
        })
        log(f"heartbeat: {answer}")
    except RemoteError as exc:
        log(f"heartbeat: push refused: {exc}")


def run() -> None:
    if "--help" in sys.argv:
        print(__doc__)
        return
    if "banner" in os.environ.get("HEARTBEAT_QUIRKS", "").split(","):
        sys.stdout.write("heartbeat-mcpl starting...\n")
        sys.stdout.flush()
    server = McplServer("heartbeat-mcpl", MANIFEST, tools=True)
    server.handlers["featureSets/update"] = refuse_policy
    started = time.time()

    async def uptime(arguments: dict) -> list[dict]:
        return text(f"heartbeat up for {time.time() - started:.0f} s")

    # heartbeat-mcpl serves MCP tools beside its pushes; one is enough to be called like it.
    server.add_tool("uptime", uptime, description="How long the heartbeat has been running")
    server.run(main)


if __name__ == "__main__":
    run()
