"""The console as a chat channel, for `mcplhost dev` (MCPL 0.5, standard library only).

`mcplhost dev` relays each line typed on its terminal to this connector over
a Unix socket; the connector registers one bidirectional channel, `console`,
and delivers each line through `channels/incoming` as a message from
`operator`. A line that names one of the agents it is told of (`@NAME`
anywhere, or `NAME:` / `NAME,` at its start: addressing.py, the rule the
host's wake rules use too) is a mention: tagged `chat:mention` (which
implies `chat:addressed`), with `metadata.mentions`, so `wake_on =
["addressed"]` wakes it as a mention on a chat platform would. Any other
line is stored and heard, and wakes only an agent whose `wake_on` matches it
otherwise (`all`, or `console`). See docs/connectors.md §12 and
README.md#start-here.

It answers `channels/publish` as a platform does (`{delivered, messageId}`),
then delivers the published text back as an echo, which is how the reply
shows in dev's live view. Settings (environment):

    CONSOLE_SOCKET   the Unix socket dev relays typed lines on (required)
    CONSOLE_AGENTS   comma list of the agents a line can name
                     (default "scout"); the first is the author of echoes
    STAGE_ECHO_DELAY_S  seconds before a published message comes back (default 0.2)
"""

from __future__ import annotations

import asyncio
import os
import sys

from .addressing import addressed_names
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


def typed(line: str, agents: list[str]) -> Said:
    """One typed line as the message the console sends: a mention when it names one of the agents."""
    named = addressed_names(line, agents)
    return Said(CHANNEL_ID, OPERATOR, line, tags=[MENTION_TAG] if named else [],
                metadata={"mentions": [f"@{agent}" for agent in named]} if named else None)


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
