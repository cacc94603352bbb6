"""The typing repeater (mcplhost/speech/typing.py, docs/agents.md#typing-and-acknowledge).

"start" once routing is decided, repeated at the interval, "stop" on leaving however the body ends; nothing
to a connector without channels.typing; a failing or hanging send never holds the body. A short repeat
interval stands in for 8 s; every wait is on a condition.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs

from mcplhost.protocol.ports import ConnectorGone, State
from mcplhost.speech.routing import ChannelView, Destination, Undecided
from mcplhost.speech.typing import TYPING_METHOD, TYPING_REPEAT_S, Typing, typing_target

CHANNEL = "discord:g1:random"
WHERE = Destination(server_id="discord", channel_id=CHANNEL)


class TypingHandle:
    """A NotifyPort (state, grant, notify), keeping the notifications it was sent."""

    def __init__(self, grant: frozenset[str] = frozenset({"channels.typing"}), *, fail: bool = False,
                 hang: bool = False) -> None:
        self.state = State.READY
        self.grant = grant
        self.fail = fail
        self.hang = hang
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.changed = anyio.Event()

    async def notify(self, method: str, params: Any = None) -> None:
        await anyio.lowlevel.checkpoint()  # like a write to the pipe: where a cancellation lands
        self.sent.append((method, params))
        self.changed.set()
        self.changed = anyio.Event()
        if self.hang:
            await anyio.sleep_forever()
        if self.fail:
            raise ConnectorGone("discord", State.READY, "its process life ended before channels/typing went out")

    def ops(self) -> list[str]:
        return [params["op"] for _, params in self.sent]

    async def until(self, count: int) -> None:
        with anyio.fail_after(5):
            while len(self.sent) < count:
                await self.changed.wait()


def destination() -> Destination:
    return WHERE


class TestTyping:
    def test_the_repeat_is_eight_seconds(self) -> None:
        assert TYPING_REPEAT_S == 8.0

    async def test_start_repeats_until_the_body_ends_then_one_stop(self) -> None:
        """Three starts at a short interval, then leaving sends exactly one stop, the last notification."""
        handle = TypingHandle()
        async with Typing({"discord": handle}, repeat_s=0.01) as typing:
            typing.start(destination())
            await handle.until(3)
        assert handle.ops()[-1] == "stop" and handle.ops().count("stop") == 1
        assert set(handle.ops()[:-1]) == {"start"} and len(handle.ops()) >= 4
        assert {method for method, _ in handle.sent} == {TYPING_METHOD}
        assert {params["channelId"] for _, params in handle.sent} == {CHANNEL}

    async def test_a_second_start_changes_nothing(self) -> None:
        handle = TypingHandle()
        async with Typing({"discord": handle}, repeat_s=3600) as typing:
            typing.start(destination())
            typing.start(Destination(server_id="discord", channel_id="discord:g1:general"))
            await handle.until(1)
        assert handle.sent == [(TYPING_METHOD, {"channelId": CHANNEL, "op": "start"}),
                               (TYPING_METHOD, {"channelId": CHANNEL, "op": "stop"})]

    async def test_without_channels_typing_nothing_is_sent(self) -> None:
        handle = TypingHandle(grant=frozenset({"channels.publish"}))
        async with Typing({"discord": handle}, repeat_s=0.01) as typing:
            typing.start(destination())
            await anyio.wait_all_tasks_blocked()
        assert handle.sent == []

    async def test_no_start_no_stop(self) -> None:
        """A turn whose route is never decided shows no indicator, so it stops none."""
        handle = TypingHandle()
        async with Typing({"discord": handle}):
            pass
        assert handle.sent == []

    async def test_a_failing_body_still_stops_and_its_exception_passes_unwrapped(self) -> None:
        handle = TypingHandle()
        with pytest.raises(KeyError):
            async with Typing({"discord": handle}, repeat_s=3600) as typing:
                typing.start(destination())
                await handle.until(1)
                raise KeyError("the turn's own failure")
        assert handle.ops() == ["start", "stop"]

    async def test_a_cancelled_body_still_stops(self) -> None:
        handle = TypingHandle()
        with anyio.CancelScope() as scope:
            async with Typing({"discord": handle}, repeat_s=3600) as typing:
                typing.start(destination())
                await handle.until(1)
                scope.cancel()
                await anyio.sleep_forever()
        assert scope.cancelled_caught
        assert handle.ops() == ["start", "stop"]

    async def test_a_failing_send_is_logged_and_the_body_runs_on(self) -> None:
        handle = TypingHandle(fail=True)
        with capture_logs() as logs:
            async with Typing({"discord": handle}, repeat_s=0.01) as typing:
                typing.start(destination())
                await handle.until(2)
                assert typing.starts == 0
        assert handle.ops()[-1] == "stop"
        assert any(e["event"] == "speech.typing_failed" for e in logs)

    async def test_a_hanging_send_is_given_up_at_its_bound(self) -> None:
        """A connector that never takes the notification costs the turn at most the send bound, logged."""
        handle = TypingHandle(hang=True)
        with capture_logs() as logs:
            with anyio.fail_after(5):
                async with Typing({"discord": handle}, repeat_s=3600, send_timeout_s=0.05) as typing:
                    typing.start(destination())
                    await handle.until(1)
        assert handle.ops() == ["start", "stop"]
        assert [e["op"] for e in logs if e["event"] == "speech.typing_timeout"] == ["stop"]


class Routing:
    """What typing reads of a turn's routing (agents/speech.TurnSpeech implements it)."""

    def __init__(self, default: Destination | Undecided, *, publishable: bool = True) -> None:
        self.default = self.current = default
        self.published_default = False
        self._publishable = publishable

    def views(self) -> list[ChannelView]:
        return [ChannelView(server_id="discord", channel_id=CHANNEL, label="#random", direction="bidirectional",
                            publishable=self._publishable)]


class TestTarget:
    def test_a_decided_publishable_route_is_the_target(self) -> None:
        assert typing_target(Routing(WHERE)) == WHERE

    def test_an_undecided_route_or_a_channel_that_would_be_drafted_shows_nothing(self) -> None:
        assert typing_target(Routing(Undecided(reason="several_conversations"))) is None
        assert typing_target(Routing(WHERE, publishable=False)) is None
        elsewhere = Destination(server_id="discord", channel_id="discord:g1:unknown")
        assert typing_target(Routing(elsewhere)) is None

    async def test_no_target_sends_nothing(self) -> None:
        handle = TypingHandle()
        async with Typing({"discord": handle}, repeat_s=0.01) as typing:
            typing.start(None)
        assert handle.sent == []
