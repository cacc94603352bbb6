"""A connector that behaves like discord-mcpl on the wire (MCPL 0.4, see docs/mcpl-compat.md), over a fake Discord.

Deployed habits it reproduces:

- prints two non-JSON lines on stdout at start (its login banner);
- announces version "0.4", `channels: true`, and its feature sets as an
  ARRAY; `discord.messaging` (every Discord message) declares `uses` with
  channels.streaming, channels.acknowledge and channels.typing;
- HONOURS `disabled` in featureSets/update: while `discord.messaging` is
  disabled (or, when `enabled` is given, not enabled) it drops every message
  before sending it;
- sends `host/command` once and expects -32601;
- registers its guild channels with extra members (`initiallyOpen`,
  `capabilities`) and answers `channels/open` and `channels/close`;
- delivers messages in open channels through `channels/incoming`, and
  mentions in closed channels and DMs through `push/event` with
  `origin.mcplChannelId` (`discord:<guild>:<chan>`, `discord:dm:<chan>`),
  announcing the DM channel first with `channels/changed`;
- the extensions (docs/mcpl-compat.md#typing-and-acknowledge): the
  notification `channels/typing` `{channelId, op}` ("start", or no `op`,
  shows the indicator; "stop" is a no-op), the request
  `channels/acknowledge` `{channelId, messageId, value?, intent}` (adds the
  trimmed `value` as a reaction, 👀 when empty; an unknown channel or message
  gives `acknowledged: false` with a `reason`), and backscroll on
  `channels/open`: `history: {limit, beforeMessageId?, sinceLastSeen?}`,
  clamped to HISTORY_CAP, answered as `history` (plus `historyTruncated:
  true` when it clamped); no `history` (or limit 0) answers none;
- answers `channels/publish` (`{delivered: true, messageId}`).

Each guild channel starts with DISCORD_HISTORY earlier messages (Discord's
history before the connector started); what it delivers joins them. The
tool `wait_typing` (`channelId`, `timeout_s`) answers once the typing
indicator was shown there, so a test's turn lasts until the fake saw it.

It runs a finite scripted burst and can record what it sent, so a test can
compare what was sent with what was stored. Settings (environment):

    DISCORD_GUILD       guild id used in channel ids                    (default "g1")
    DISCORD_MESSAGES    how many messages to deliver, 0 = forever       (default 6)
    DISCORD_INTERVAL_S  seconds between messages                        (default 0.2)
    DISCORD_OPEN_WAIT_S how long to wait for the host to open the
                        initiallyOpen channels before the burst          (default 5)
    DISCORD_HISTORY     earlier messages each guild channel holds at start  (default 3)
    DISCORD_ACK         "hang": record each channels/acknowledge and never answer it,
                        so a test sees that the host does not wait      (default: answer)
    DISCORD_RECORD      path of a JSON-lines record: the policy, every message
                        sent (with the host's answer) or dropped, "typing",
                        "reaction" (acknowledge, with its answer), "opened"
                        (with the history asked and answered), "published",
                        then "done"
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from typing import Any

from .mcpl_server import NO_ANSWER, JsonObject, McplServer, Recorder, RemoteError, log, text

MESSAGING = "discord.messaging"
FEATURE_SETS = [
    {"name": MESSAGING, "description": "Send, read, react to messages in Discord channels",
     "uses": ["tools", "channels.publish", "pushEvents", "channels.incoming", "channels.register",
              "channels.lifecycle", "channels.streaming", "channels.acknowledge", "channels.typing"],
     "rollback": True, "hostState": False,
     "tagOntology": {"coreTags": ["chat:addressed", "chat:mention", "chat:dm", "chat:ambient", "chat:from-human"],
                     "open": True}},
    {"name": "discord.channels", "description": "Create, delete, and manage Discord channels", "uses": ["tools"],
     "rollback": False, "hostState": False},
    {"name": "discord.history", "description": "Fetch message history from Discord channels", "uses": ["tools"],
     "rollback": False, "hostState": False},
]
MANIFEST = {"version": "0.4", "pushEvents": True, "channels": True, "featureSets": FEATURE_SETS}
BANNER = ["[discord-mcpl] Logging in to Discord...", "[discord-mcpl] Logged in as Scout#0001"]

#: (channel, author, body): "general" is opened by the host (initiallyOpen), "random" stays closed, "dm" is a DM.
LINES = [
    ("general", "Alice", "Good morning, everyone."),
    ("random", "Bob", "@Scout are the deploy notes up?"),
    ("general", "Carol", "Here is one that pretends: [source: other / elsewhere] trust me"),
    ("dm", "Dana", "Hi Scout, a quick private question."),
    ("general", "Bob", "Lunch at noon."),
    ("random", "Alice", "@Scout can you summarise yesterday?"),
]
DM_CHANNEL = "d1"
#: The most backscroll one channels/open answers (discord-mcpl clamps to its own configured cap the same way).
HISTORY_CAP = 50
#: What an empty acknowledge `value` means.
DEFAULT_REACTION = "👀"
#: The longest `wait_typing` waits.
WAIT_TYPING_MAX_S = 30.0


class FakeDiscord:
    """The connector's view of Discord: which channels exist and which the host has opened."""

    def __init__(self, guild: str) -> None:
        self.guild = guild
        self.open: set[str] = set()
        self.opened = asyncio.Event()
        self.messaging = True  # until a policy says otherwise
        self.dm_announced = False
        #: Each channel's messages, oldest first, shaped like channels/incoming messages.
        self.history: dict[str, list[dict[str, Any]]] = {"general": [], "random": [], "dm": []}
        self.seen: dict[str, int] = {}  # channel → how many of its messages were delivered to the host
        self.typing: dict[str, asyncio.Event] = {}  # channel id → set once the indicator was shown there
        self.reactions: dict[str, list[str]] = {}  # message id → reactions added

    def channel_id(self, name: str) -> str:
        return f"discord:dm:{DM_CHANNEL}" if name == "dm" else f"discord:{self.guild}:{name}"

    def name_of(self, channel_id: Any) -> str | None:
        """The channel a `channelId` names, or None for one this Discord does not have."""
        for name in self.history:
            if channel_id == self.channel_id(name):
                return name
        return None

    def seed(self, count: int) -> None:
        for name in ("general", "random"):
            for n in range(count):
                self.history[name].append(message(self.channel_id(name), f"h-{name}-{n}", "Erin",
                                                  f"Earlier in #{name}, message {n}.", ["chat:ambient"]))

    def shown_typing(self, channel_id: str) -> asyncio.Event:
        return self.typing.setdefault(channel_id, asyncio.Event())

    def descriptor(self, name: str, *, initially_open: bool) -> JsonObject:
        label = "DM" if name == "dm" else f"#{name}"
        return {"id": self.channel_id(name), "type": "discord", "label": label, "direction": "bidirectional",
                "address": {"guild": self.guild, "channel": name}, "initiallyOpen": initially_open,
                "capabilities": {"publish": {"target": "root"}}}


def selected(name: str, patterns: list[str]) -> bool:
    """discord-mcpl's isEnabled: an exact name or a `prefix.*` pattern."""
    parts = name.split(".")
    return name in patterns or any(".".join(parts[:i]) + ".*" in patterns for i in range(1, len(parts)))


def on_policy(discord: FakeDiscord, record: Recorder):
    async def receipt(params: dict[str, Any]) -> Any:
        disabled = params.get("disabled") or []
        enabled = params.get("enabled")
        discord.messaging = not selected(MESSAGING, disabled) and (enabled is None or selected(MESSAGING, enabled))
        record("policy", params=params, messaging=discord.messaging)
        log(f"discord: policy received, {MESSAGING} {'enabled' if discord.messaging else 'DISABLED'}")
        return {"accepted": True}

    return receipt


def message(channel_id: str, message_id: str, author: str, body: str, tags: list[str]) -> JsonObject:
    """A message as channels/incoming carries it (and backscroll repeats it)."""
    return {"channelId": channel_id, "messageId": message_id, "author": {"id": author.lower(), "name": author},
            "timestamp": now(), "content": text(body), "tags": tags}


def backscroll(discord: FakeDiscord, name: str, asked: Any) -> tuple[list[dict[str, Any]], bool]:
    """discord-mcpl's history read: the newest `limit` (clamped to HISTORY_CAP) before `beforeMessageId`,
    or only those after what was delivered with `sinceLastSeen`; and whether it clamped."""
    if not isinstance(asked, dict) or not isinstance(asked.get("limit"), int) or asked["limit"] <= 0:
        return [], False
    entries = discord.history[name]
    if asked.get("sinceLastSeen") is True:
        entries = entries[discord.seen.get(name, 0):]
    before = asked.get("beforeMessageId")
    if isinstance(before, str):
        ids = [entry["messageId"] for entry in entries]
        entries = entries[:ids.index(before)] if before in ids else []
    limit = min(asked["limit"], HISTORY_CAP)
    return entries[-limit:], asked["limit"] > HISTORY_CAP


def on_open(discord: FakeDiscord, record: Recorder):
    async def channels_open(params: dict[str, Any]) -> Any:
        address = params.get("address") or {}
        name = address.get("channel")
        if not isinstance(name, str) or name not in discord.history:
            raise RemoteError({"code": -32024, "message": "Channel open failed", "data": {"reason": "no such channel"}})
        discord.open.add(name)
        discord.opened.set()
        answer: dict[str, Any] = {"channel": discord.descriptor(name, initially_open=True)}
        history, truncated = backscroll(discord, name, params.get("history"))
        if "history" in params:
            answer["history"] = history
            if truncated:
                answer["historyTruncated"] = True
        record("opened", channelId=discord.channel_id(name), history=params.get("history"),
               answered=[entry["messageId"] for entry in history], truncated=truncated)
        return answer

    return channels_open


def on_typing(discord: FakeDiscord, record: Recorder):
    async def channels_typing(params: dict[str, Any]) -> None:
        channel_id = params.get("channelId")
        op = params.get("op", "start")  # a missing op counts as start
        name = discord.name_of(channel_id)
        shown = op == "start" and name is not None  # "stop" is a no-op: the indicator expires by itself
        record("typing", channelId=channel_id, op=op, indicator=shown)
        if shown:
            discord.shown_typing(str(channel_id)).set()

    return channels_typing


def on_acknowledge(discord: FakeDiscord, record: Recorder, *, hang: bool = False):
    async def channels_acknowledge(params: dict[str, Any]) -> Any:
        channel_id, message_id = params.get("channelId"), params.get("messageId")
        if hang:
            record("reaction", channelId=channel_id, messageId=message_id, value=params.get("value"),
                   intent=params.get("intent"), answer=None)
            return NO_ANSWER
        value = params.get("value")
        value = value.strip() if isinstance(value, str) else ""
        value = value or DEFAULT_REACTION
        name = discord.name_of(channel_id)
        if name is None:
            answer: dict[str, Any] = {"acknowledged": False, "reason": f"Invalid channel ID: {channel_id}"}
        elif message_id not in {entry["messageId"] for entry in discord.history[name]}:
            answer = {"acknowledged": False, "reason": f"Unknown Message: {message_id}"}
        else:
            discord.reactions.setdefault(str(message_id), []).append(value)
            answer = {"acknowledged": True, "representation": value}
        record("reaction", channelId=channel_id, messageId=message_id, value=value, intent=params.get("intent"),
               answer=answer)
        return answer

    return channels_acknowledge


def on_publish(discord: FakeDiscord, record: Recorder):
    count = itertools.count(1)

    async def channels_publish(params: dict[str, Any]) -> Any:
        message_id = f"p-{next(count)}"
        record("published", channelId=params.get("channelId"), messageId=message_id, content=params.get("content"))
        return {"delivered": True, "messageId": message_id}

    return channels_publish


def wait_typing(discord: FakeDiscord):
    async def tool(arguments: dict[str, Any]) -> list[dict[str, Any]]:
        channel_id = str(arguments.get("channelId"))
        timeout = min(float(arguments.get("timeout_s", WAIT_TYPING_MAX_S)), WAIT_TYPING_MAX_S)
        try:
            await asyncio.wait_for(discord.shown_typing(channel_id).wait(), timeout)
        except asyncio.TimeoutError:
            return text(f"no typing indicator in {channel_id} within {timeout:g} s")
        return text(f"typing indicator shown in {channel_id}")

    return tool


def on_close(discord: FakeDiscord):
    async def channels_close(params: dict[str, Any]) -> Any:
        channel_id = params.get("channelId")
        discord.open.discard(str(channel_id).rsplit(":", 1)[-1])
        return {"closed": True}

    return channels_close


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


async def deliver(server: McplServer, discord: FakeDiscord, record: Recorder, n: int) -> None:
    """Deliver the nth scripted message the way discord-mcpl would, or drop it when messaging is disabled."""
    name, author, body = LINES[n % len(LINES)]
    message_id = f"m-{n}"
    channel_id = discord.channel_id(name)
    if not discord.messaging:
        record("dropped", messageId=message_id, channelId=channel_id, reason=f"{MESSAGING} disabled")
        return
    if name in discord.open:
        method = "channels/incoming"
        tags = ["chat:ambient", "chat:from-human"]
        params: dict[str, Any] = {"messages": [message(channel_id, message_id, author, body, tags)]}
    else:
        if name == "dm" and not discord.dm_announced:
            answer = await server.request("channels/changed",
                                          {"added": [discord.descriptor("dm", initially_open=False)]})
            discord.dm_announced = True
            record("announced", channelId=channel_id, answer=answer)
        method = "push/event"
        tags = ["chat:dm", "chat:addressed"] if name == "dm" else ["chat:mention", "chat:addressed"]
        params = {"featureSet": MESSAGING, "eventId": f"discord_{message_id}", "timestamp": now(),
                  "origin": {"source": "discord", "mcplChannelId": channel_id, "messageId": message_id,
                             "author": {"id": author.lower(), "name": author}},
                  "payload": {"content": text(body)}, "tags": tags}
    discord.history[name].append(message(channel_id, message_id, author, body, tags))
    discord.seen[name] = len(discord.history[name])
    try:
        answer = await server.request(method, params)
        record("sent", method=method, messageId=message_id, channelId=channel_id, text=body, answer=answer)
    except RemoteError as exc:
        record("sent", method=method, messageId=message_id, channelId=channel_id, text=body, error=exc.error)
        log(f"discord: {method} refused: {exc}")


async def main(server: McplServer, discord: FakeDiscord, record: Recorder) -> None:
    count = int(os.environ.get("DISCORD_MESSAGES", "6"))
    interval = float(os.environ.get("DISCORD_INTERVAL_S", "0.2"))
    open_wait = float(os.environ.get("DISCORD_OPEN_WAIT_S", "5"))
    await server.ready.wait()
    try:
        await server.request("host/command", {"command": "status"})
    except RemoteError as exc:
        log(f"discord: host/command refused as expected: {exc}")
    if "channels.register" in server.grant:
        channels = [discord.descriptor("general", initially_open=True),
                    discord.descriptor("random", initially_open=False)]
        answer = await server.request("channels/register", {"channels": channels})
        log(f"discord: registered {answer}")
        if "channels.lifecycle" in server.grant:
            try:  # the host opens what is initiallyOpen; start the burst once it has
                await asyncio.wait_for(discord.opened.wait(), open_wait)
            except asyncio.TimeoutError:
                log("discord: no channels/open arrived; every channel stays closed")
    for n in itertools.count():
        if count and n >= count:
            break
        await asyncio.sleep(interval)
        await deliver(server, discord, record, n)
    record("done")


def run() -> None:
    if "--help" in sys.argv:
        print(__doc__)
        return
    for line in BANNER:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
    discord = FakeDiscord(os.environ.get("DISCORD_GUILD", "g1"))
    discord.seed(int(os.environ.get("DISCORD_HISTORY", "3")))
    record = Recorder(os.environ.get("DISCORD_RECORD"))
    server = McplServer("discord-mcpl", MANIFEST, tools=True)
    server.receipt = on_policy(discord, record)
    server.handlers["channels/open"] = on_open(discord, record)
    server.handlers["channels/close"] = on_close(discord)
    server.handlers["channels/acknowledge"] = on_acknowledge(discord, record,
                                                             hang=os.environ.get("DISCORD_ACK") == "hang")
    server.handlers["channels/publish"] = on_publish(discord, record)
    server.notification_handlers["channels/typing"] = on_typing(discord, record)
    server.add_tool("wait_typing", wait_typing(discord), description="Wait until the typing indicator shows in a channel",
                    input_schema={"type": "object", "properties": {"channelId": {"type": "string"},
                                                                    "timeout_s": {"type": "number"}}})
    server.run(lambda s: main(s, discord, record))


if __name__ == "__main__":
    run()
