"""A stub shaped like Zulip (MCPL 0.5) for `mcplhost dev` and tests: streams as channels, topics as threads.

Every Zulip message belongs to a topic of a stream, so every message it sends
carries the topic as its `threadId`; a reply published to a topic's
conversation goes back into that topic. It answers `channels/publish` with a
messageId and delivers the published message back, as Zulip does (see
stage.py). Settings (environment):

    ZULIP_MESSAGES    how many messages to send, 0 = all of them (default 0)
    ZULIP_DELAY_S     seconds before the first message            (default 1.0)
    ZULIP_INTERVAL_S  seconds between messages                    (default 1.0)
    STAGE_ECHO_DELAY_S  seconds before a published message comes back (default 0.2)

Test-only: MCPL_TEST_CLOCK runs the timed steps on a test's clock
(mcpl_server.py `timed_steps`); the messages and their order stay the same.
"""

from __future__ import annotations

import os
import sys

from .mcpl_server import McplServer, RemoteError, log, timed_steps
from .stage import Echoes, Said, say

MANIFEST = {
    "version": "0.5",
    "channels": {"register": True, "incoming": True, "publish": True},
    "featureSets": {
        "zulip.messages": {"description": "Messages in Zulip streams, each in its topic",
                           "uses": ["channels.register", "channels.incoming", "channels.publish"]},
    },
}
STREAMS = [{"id": f"zulip:{name}", "type": "zulip-stream", "label": f"#{name}", "direction": "bidirectional",
            "address": {"stream": name}} for name in ("engineering", "social")]
LINES = [
    Said("zulip:engineering", "Ines", "Deploy 42 is out.", thread="deploys"),
    Said("zulip:engineering", "Jo", "@scout what changed in 42?", thread="deploys", tags=["chat:mention"]),
    Said("zulip:social", "Ines", "Cake in the kitchen.", thread="kitchen"),
]


async def main(server: McplServer) -> None:
    count = int(os.environ.get("ZULIP_MESSAGES", "0"))
    delay = float(os.environ.get("ZULIP_DELAY_S", "1.0"))
    interval = float(os.environ.get("ZULIP_INTERVAL_S", "1.0"))
    await server.ready.wait()
    if "channels.register" not in server.grant:
        return
    log(f"zulip: registered {await server.request('channels/register', {'channels': STREAMS})}")
    async with timed_steps() as steps:
        await steps.after(max(0.0, delay - interval))
        for said in LINES[:count or None]:
            await steps.after(interval)
            try:
                await say(server, [said])
            except RemoteError as exc:
                log(f"zulip: refused: {exc}")


if __name__ == "__main__":
    if "--help" in sys.argv:
        print(__doc__)
    else:
        zulip = McplServer("zulip", MANIFEST)
        Echoes(zulip, author={"id": "scout-bot", "name": "Scout"}, prefix="z")
        zulip.run(main)
