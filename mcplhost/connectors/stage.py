"""What the chat-shaped stubs share: sending staged messages, and answering publishes as a platform would.

A platform answers `channels/publish` with the id of the message it posted,
then delivers that message back like any other (Discord and Zulip both send
a bot its own messages): `Echoes` does both, in the thread of the
conversation published to. The host's `channels/incoming` answers name each
message's conversation, so `say` remembers which thread each one is.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any

from .mcpl_server import JsonObject, McplServer, RemoteError, log, text

#: How long after answering a publish the platform delivers it back: after the answer, as on Discord, and late
#: enough that the host has recorded the delivery (so the echo is known as one when it arrives). The setting
#: STAGE_ECHO_DELAY_S (environment) overrides it: tests on a stepped clock take less.
ECHO_DELAY_S = 0.2
ECHO_DELAY_ENV = "STAGE_ECHO_DELAY_S"
#: conversationId → (channelId, threadId) as the host named them; bounded by the staged messages.
CONVERSATIONS: dict[str, tuple[str, str | None]] = {}
_MESSAGE_IDS = itertools.count()


@dataclass(frozen=True)
class Said:
    """One staged message."""

    channel_id: str
    author: str
    body: str
    thread: str | None = None
    reply_to: str | None = None
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] | None = None  # the platform's own fields (e.g. its mention list)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def wire(said: Said, message_id: str) -> JsonObject:
    message: dict[str, Any] = {"channelId": said.channel_id, "messageId": message_id,
                               "author": {"id": said.author.lower(), "name": said.author},
                               "timestamp": now(), "content": text(said.body)}
    if said.thread is not None:
        message["threadId"] = said.thread
    if said.reply_to is not None:
        message["replyTo"] = said.reply_to
    if said.tags:
        message["tags"] = list(said.tags)
    if said.metadata:
        message["metadata"] = dict(said.metadata)
    return message


async def say(server: McplServer, messages: list[Said]) -> Any:
    """Send the messages in one `channels/incoming` (ids m-0, m-1, … in order), remembering their conversations."""
    wired = [wire(said, f"m-{next(_MESSAGE_IDS)}") for said in messages]
    answer = await server.request("channels/incoming", {"messages": wired})
    remember(wired, answer)
    return answer


def remember(wired: list[dict[str, Any]], answer: Any) -> None:
    results = answer.get("results") if isinstance(answer, dict) else None
    for message, result in zip(wired, results or [], strict=False):
        if isinstance(result, dict) and isinstance(result.get("conversationId"), str):
            CONVERSATIONS[result["conversationId"]] = (message["channelId"], message.get("threadId"))


def echo_delay_s() -> float:
    """ECHO_DELAY_S, or the setting STAGE_ECHO_DELAY_S when it is a number of seconds from 0 up."""
    try:
        seconds = float(os.environ.get(ECHO_DELAY_ENV, ECHO_DELAY_S))
    except ValueError:
        return ECHO_DELAY_S
    return seconds if 0 <= seconds < float("inf") else ECHO_DELAY_S


class Echoes:
    """Answers `channels/publish` with a fresh messageId, then delivers the published message back."""

    def __init__(self, server: McplServer, *, author: dict[str, str], prefix: str = "out") -> None:
        self.server = server
        self.author = author
        self.prefix = prefix
        self.ids = itertools.count(1)
        self.tasks: set[asyncio.Task[Any]] = set()
        server.handlers["channels/publish"] = self.publish

    async def publish(self, params: dict[str, Any]) -> JsonObject:
        message_id = f"{self.prefix}-{next(self.ids)}"
        channel_id = params.get("channelId")
        _, thread = CONVERSATIONS.get(str(params.get("conversationId")), (channel_id, None))
        echo: dict[str, Any] = {"channelId": channel_id, "messageId": message_id, "author": self.author,
                                "timestamp": now(), "content": params.get("content") or text("")}
        if thread is not None:
            echo["threadId"] = thread
        if "channels.incoming" in self.server.grant:
            task = asyncio.create_task(self._deliver(echo))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return {"delivered": True, "messageId": message_id}

    async def _deliver(self, echo: dict[str, Any]) -> None:
        await asyncio.sleep(echo_delay_s())
        try:
            await self.server.request("channels/incoming", {"messages": [echo]})
        except (RemoteError, TimeoutError) as exc:  # the echo is the platform's courtesy; losing one is a log line
            log(f"{self.server.name}: echo of {echo['messageId']} not delivered: {exc}")
