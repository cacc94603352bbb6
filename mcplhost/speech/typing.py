"""The typing indicator while a turn runs: `channels/typing` (docs/agents.md#typing-and-acknowledge).

An extension, shaped as discord-mcpl 0.1.4 defines it
(docs/mcpl-compat.md#typing-and-acknowledge): the notification
`{channelId, op: "start" | "stop"}`. Discord's indicator expires by itself
after a few seconds and "stop" is a no-op there, so "start" is repeated
every `TYPING_REPEAT_S` while the turn runs.

    async with Typing(handles) as typing:
        ...
        typing.start(typing_target(speech))   # once routing is decided
        ...
    # leaving: the repeats end and "stop" goes out, however the turn ended

Only a connector that serves and holds `channels.typing` now is sent
anything (asked again before each send, so a narrowed grant stops the
repeats). Each send is bounded by `TYPING_SEND_TIMEOUT_S`; a failing or slow
send is logged and never delays or fails the turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

import anyio
import structlog

from mcplhost.protocol.ports import NOTIFY_FAILURES, NotifyPort, State
from mcplhost.speech.routing import Destination
from mcplhost.speech.streaming import TurnRouting

log = structlog.get_logger()

TYPING = "channels.typing"
TYPING_METHOD = "channels/typing"
#: How often "start" is sent again while a turn runs (discord-mcpl's indicator lasts about 10 s).
TYPING_REPEAT_S = 8.0
#: The longest one typing notification may take to go out; a slower one is given up (logged).
TYPING_SEND_TIMEOUT_S = 2.0


def may_type(handle: NotifyPort | None) -> bool:
    """Whether a connector may be sent `channels/typing` now: it serves (ready) and holds channels.typing."""
    return handle is not None and handle.state is State.READY and TYPING in handle.grant


def typing_target(speech: TurnRouting) -> Destination | None:
    """Where a turn shows it is typing: its default destination, when routing decided one it may publish to now.

    An undecided route shows nothing (there is no one place the answer goes),
    nor does a channel the answer would only be drafted for.
    """
    default = speech.default
    if not isinstance(default, Destination):
        return None
    publishable = any(v.server_id == default.server_id and v.channel_id == default.channel_id and v.publishable
                      for v in speech.views())
    return default if publishable else None


class Typing:
    """The typing indicator of one turn: `start(destination)` once, repeated until the `async with` ends."""

    def __init__(self, handles: Mapping[str, NotifyPort], *, repeat_s: float = TYPING_REPEAT_S,
                 send_timeout_s: float = TYPING_SEND_TIMEOUT_S, agent: str | None = None) -> None:
        self._handles = handles
        self._agent = agent  # named in the one `speech.typing` line a turn logs
        self._repeat_s = repeat_s
        self._send_timeout_s = send_timeout_s
        self._destination: Destination | None = None
        self._task_group = anyio.create_task_group()  # entered by __aenter__: a Typing is used once
        self.starts = 0  # "start" notifications that went out

    def start(self, destination: Destination | None) -> None:
        """Routing is decided: show the indicator in `destination` until the turn ends. Once; a later call is ignored.

        None (no decided, publishable route: `typing_target`) shows nothing.
        """
        if destination is None or self._destination is not None:
            return
        if not may_type(self._handles.get(destination.server_id)):
            return
        self._destination = destination
        # One line per turn, not per repeat (the `mcplhost dev` view shows it).
        log.info("speech.typing", agent=self._agent, connector=destination.server_id,
                 channel=destination.channel_id, thread=destination.thread_id)
        self._task_group.start_soon(self._repeat)

    async def __aenter__(self) -> Typing:
        await self._task_group.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        self._task_group.cancel_scope.cancel()
        try:
            # The body's own exception is not the repeater's: it propagates as it is, never inside a group.
            await self._task_group.__aexit__(None, None, None)
        finally:
            if self._destination is not None:
                with anyio.CancelScope(shield=True):  # an aborted turn stops its indicator too
                    await self._send("stop")
        return None

    async def _repeat(self) -> None:
        while True:
            if await self._send("start"):
                self.starts += 1
            await anyio.sleep(self._repeat_s)

    async def _send(self, op: str) -> bool:
        """One notification, bounded; whether it went out. Never raises (but a cancellation)."""
        destination = self._destination
        assert destination is not None
        handle = self._handles.get(destination.server_id)
        if not may_type(handle):
            return False
        assert handle is not None
        with anyio.move_on_after(self._send_timeout_s) as bound:
            try:
                await handle.notify(TYPING_METHOD, {"channelId": destination.channel_id, "op": op})
                return True
            except NOTIFY_FAILURES:
                log.info("speech.typing_failed", connector=destination.server_id, channel=destination.channel_id,
                         op=op, exc_info=True)
                return False
        if bound.cancelled_caught:
            log.info("speech.typing_timeout", connector=destination.server_id, channel=destination.channel_id,
                     op=op, timeout_s=self._send_timeout_s)
        return False
