"""The console as a chat channel, for `mcplhost dev` (MCPL 0.5, standard library only).

`mcplhost dev` relays each line typed on its terminal to this connector over
a Unix socket; the connector registers one bidirectional channel, `console`,
and delivers each line through `channels/incoming` as a message from
`operator`. A line that opens with `@NAME`, NAME one of the agents it is
told of, is a mention of that agent: tagged `chat:mention` (which implies
`chat:addressed`), with `metadata.mentions`, so `wake_on = ["addressed"]`
wakes it as a mention on a chat platform would. Any other line is stored and
heard, and wakes only an agent whose `wake_on` matches it otherwise (`all`,
or `console`). See docs/connectors.md §12 and README.md#start-here.

It answers `channels/publish` as a platform does (`{delivered, messageId}`),
then delivers the published text back as an echo, which is how the reply
shows in dev's live view. Settings (environment):

    CONSOLE_SOCKET   the Unix socket dev relays typed lines on (required)
    CONSOLE_AGENTS   comma list of the agents a leading @NAME mentions
                     (default "scout"); the first is the author of echoes
    STAGE_ECHO_DELAY_S  seconds before a published message comes back (default 0.2)
"""

from __future__ import annotations

import asyncio
import os
import re
import sys

from .mcpl_server import McplServer, RemoteError, log
from .stage import Echoes, Said, say

MANIFEST = {"version": "0.5", "channels": {"register": True, "incoming": True, "publish": True}}
CHANNEL_ID = "console"
CHANNEL = {"id": CHANNEL_ID, "type": "console", "label": "console", "direction": "bidirectional", "address": {}}
OPERATOR = "operator"
MENTION_TAG = "chat:mention"
#: The longest line relayed, in characters; dev cuts longer ones (a paste is not a message).
LINE_MAX_CHARS = 4000
#: How long to wait for dev's socket to accept a connection (it listens before the host starts).
CONNECT_TIMEOUT_S = 5.0
#: `@name` at the very start, then a space, punctuation or the end: `@scout, hi` and `@scout` mention scout.
_MENTION = re.compile(r"\A\s*@([\w.-]+?)(?=[\s,:;!?]|\Z)")


def mentioned(line: str, agents: list[str]) -> str | None:
    """The agent (as configured) a line opens with `@NAME` of, NAME matched without case; None for no mention."""
    match = _MENTION.match(line)
    if match is None:
        return None
    wanted = match.group(1).casefold()
    return next((agent for agent in agents if agent.casefold() == wanted), None)


def typed(line: str, agents: list[str]) -> Said:
    """One typed line as the message the console sends: a mention when it opens with an agent's @NAME."""
    agent = mentioned(line, agents)
    return Said(CHANNEL_ID, OPERATOR, line, tags=[MENTION_TAG] if agent else [],
                metadata={"mentions": [f"@{agent}"]} if agent else None)


def agents_from(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


async def main(server: McplServer) -> None:
    agents = agents_from(os.environ.get("CONSOLE_AGENTS", "scout"))
    await server.ready.wait()
    if "channels.register" not in server.grant or "channels.incoming" not in server.grant:
        log("console: not granted channels.register and channels.incoming; nothing typed is delivered")
        return
    path = os.environ.get("CONSOLE_SOCKET")
    if not path:
        log("console: CONSOLE_SOCKET is not set; this connector relays what is typed into `mcplhost dev`")
        return
    await server.request("channels/register", {"channels": [CHANNEL]})
    try:
        reader, _ = await asyncio.wait_for(asyncio.open_unix_connection(path, limit=LINE_MAX_CHARS * 4 + 2),
                                           CONNECT_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError) as exc:
        log(f"console: cannot reach {path}: {exc}")
        return
    while line := await reader.readline():
        text = line.decode("utf-8", "replace").rstrip("\n")
        if not text.strip():
            continue
        try:
            await say(server, [typed(text, agents)])
        except RemoteError as exc:
            log(f"console: refused: {exc}")


if __name__ == "__main__":
    if "--help" in sys.argv:
        print(__doc__)
    else:
        console = McplServer("console", MANIFEST)
        first = (agents_from(os.environ.get("CONSOLE_AGENTS", "scout")) or ["scout"])[0]
        Echoes(console, author={"id": first.lower(), "name": first.capitalize()})
        console.run(main)
