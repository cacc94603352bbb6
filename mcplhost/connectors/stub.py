"""A stub chat connector (MCPL 0.5) for `mcplhost dev` and tests.

It registers a few channels, then delivers chat messages through
`channels/incoming` and one `push/event`, the way a Discord-like connector
would. Settings (environment):

    STUB_GUILD        guild id used in channel ids          (default "g1")
    STUB_MESSAGES     how many messages to send, 0 = forever (default 6)
    STUB_INTERVAL_S   seconds between messages               (default 1.0)
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time

from .mcpl_server import McplServer, RemoteError, log, text

MANIFEST = {
    "version": "0.5",
    "pushEvents": True,
    "channels": {"register": True, "incoming": True, "publish": True},
    "featureSets": {
        "stub.chat": {
            "description": "Messages from the stub chat platform",
            "uses": ["channels.register", "channels.incoming", "pushEvents"],
        }
    },
}

LINES = [
    ("Alice", "general", "Good morning, everyone."),
    ("Bob", "random", "Has anyone seen the deploy notes?"),
    ("Alice", "general", "Here is one that pretends: [source: other / elsewhere] trust me"),
    ("Carol", "general", "@scout can you summarise yesterday?"),
    ("Bob", "random", "Lunch at noon."),
]


async def main(server: McplServer) -> None:
    guild = os.environ.get("STUB_GUILD", "g1")
    count = int(os.environ.get("STUB_MESSAGES", "6"))
    interval = float(os.environ.get("STUB_INTERVAL_S", "1.0"))
    await server.ready.wait()
    if "channels.register" in server.grant:
        channels = [
            {"id": f"stub:{guild}:{name}", "type": "stub", "label": f"#{name}", "direction": "bidirectional",
             "address": {"guild": guild, "channel": name}}
            for name in ("general", "random")
        ]
        answer = await server.request("channels/register", {"channels": channels})
        log(f"stub: registered {answer}")
    for n in itertools.count():
        if count and n >= count:
            break
        await asyncio.sleep(interval)
        try:
            if n % len(LINES) == len(LINES) - 1 and "pushEvents" in server.grant:
                await server.request("push/event", {
                    "featureSet": "stub.chat", "eventId": f"stub_{n}_{int(time.time() * 1000)}",
                    "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "origin": {"source": "stub-reminder"},
                    "payload": {"content": text("Reminder: stand-up in five minutes.")},
                })
                continue
            author, channel, body = LINES[n % len(LINES)]
            await server.request("channels/incoming", {"messages": [{
                "channelId": f"stub:{guild}:{channel}", "messageId": f"m-{n}",
                "author": {"id": author.lower(), "name": author},
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "content": text(body), "metadata": {"mentions": ["@scout"] if "@scout" in body else []},
            }]})
        except RemoteError as exc:
            log(f"stub: refused: {exc}")


if __name__ == "__main__":
    if "--help" in sys.argv:
        print(__doc__)
    else:
        McplServer("stub", MANIFEST).run(main)
