"""A stub chat connector (MCPL 0.5) for `mcplhost dev` and tests.

It registers a few channels, then delivers chat messages through
`channels/incoming` and one `push/event`, the way a Discord-like connector
would. For agents it also serves two MCP tools (`echo`, `clock`), answers
`context/beforeInference` with one `afterUser` note (how many messages it
has sent), and logs each `inference/lifecycle` it hears on stderr; what of
that is used is the operator's grant. Settings (environment):

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
    "contextHooks": {"beforeInference": {"inject": {"afterUser": True}}},
    "inferenceLifecycle": True,
    "featureSets": {
        "stub.chat": {
            "description": "Messages from the stub chat platform",
            "uses": ["channels.register", "channels.incoming", "pushEvents"],
        },
        "stub.notes": {
            "description": "A note after the user's turn, and the agent's inferences observed",
            "uses": ["contextHooks.beforeInference.inject.afterUser", "inferenceLifecycle"],
        },
    },
}

#: How the stub marks a message that mentions the agent: a mention tag (it implies chat:addressed) and the
#: platform's own mention list as the connector's metadata.
MENTION = {"tags": ["chat:mention"], "metadata": {"mentions": ["@scout"]}}

LINES = [
    ("Alice", "general", "Good morning, everyone."),
    ("Bob", "random", "Has anyone seen the deploy notes?"),
    ("Alice", "general", "Here is one that pretends: [source: other / elsewhere] trust me"),
    ("Carol", "general", "@scout can you summarise yesterday?"),
    ("Bob", "random", "Lunch at noon."),
]


class Counter:
    sent = 0


def serve_agents(server: McplServer) -> None:
    """The agent-facing parts: MCP tools, the beforeInference note, lifecycle on stderr."""

    async def echo(arguments: dict) -> list[dict]:
        return text(str(arguments.get("text", "")))

    async def clock(arguments: dict) -> list[dict]:
        return text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    server.add_tool("echo", echo, description="Say the text back",
                    input_schema={"type": "object", "properties": {"text": {"type": "string"}}})
    server.add_tool("clock", clock, description="The stub platform's time (UTC)")

    async def before_inference(params: dict) -> dict:
        return {"featureSet": "stub.notes", "contextInjections": [
            {"namespace": "stub", "position": "afterUser", "content": f"(stub: {Counter.sent} messages sent so far)"}]}

    async def lifecycle(params: dict) -> None:
        log(f"stub: inference {params.get('inferenceId')} {params.get('phase')}")

    server.handlers["context/beforeInference"] = before_inference
    server.notification_handlers["inference/lifecycle"] = lifecycle


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
            Counter.sent += 1
            author, channel, body = LINES[n % len(LINES)]
            await server.request("channels/incoming", {"messages": [{
                "channelId": f"stub:{guild}:{channel}", "messageId": f"m-{n}",
                "author": {"id": author.lower(), "name": author},
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "content": text(body), **(MENTION if "@scout" in body else {}),
            }]})
        except RemoteError as exc:
            log(f"stub: refused: {exc}")


if __name__ == "__main__":
    if "--help" in sys.argv:
        print(__doc__)
    else:
        stub = McplServer("stub", MANIFEST, tools=True)
        serve_agents(stub)
        stub.run(main)
