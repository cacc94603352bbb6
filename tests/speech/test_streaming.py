"""Streaming on the wire: channels/outgoing/chunk and /complete from a `Streamer` to real scripted connectors.

docs/agents.md#streaming: no chunk before routing is decided, exactly one complete per
(inference, channel) on every way the turn ends (abort included), one rising
index per inference across channels, and nothing to a connector that does not
hold channels.streaming.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.config import AgentConfig, BackendConfig, Config
from mcplhost.host import Host, open_host
from mcplhost.speech.routing import PIN_MARK, ChannelView, Destination, Undecided
from mcplhost.speech.streaming import COMPLETE, STREAMING, Streamer, stream_targets, streamable_end
from mcplhost.supervisor.handle import State

from ..harness import config_with, record, running_host, scripted, wait_for

MANIFEST: dict[str, Any] = {
    "version": "0.5",
    "channels": {"register": True, "incoming": True, "streaming": True},
    "featureSets": {"chat": {"description": "chat", "uses": ["channels.register", "channels.streaming"]}},
}
GRANT = ["channels.register", "channels.streaming"]


def outgoing(folder, name: str, inference_id: str | None = None) -> list[dict[str, Any]]:
    """The channels/outgoing/* notifications a connector received, in arrival order."""
    return [m for m in record(folder, name).received
            if str(m.get("method", "")).startswith("channels/outgoing/")
            and (inference_id is None or m["params"]["inferenceId"] == inference_id)]


@asynccontextmanager
async def streaming_host(folder, *specs: Any, offered_streaming: bool = True) -> AsyncIterator[Host]:
    """A host running `specs`; with `offered_streaming=False` its connections may not grant channels.streaming."""
    stop = anyio.Event()
    async with open_host(config_with(folder, *specs)) as host, anyio.create_task_group() as tg:
        if not offered_streaming:
            for handle in host.connectors.values():
                handle.offered = handle.offered - {STREAMING}
        tg.start_soon(host.run, stop)
        with anyio.fail_after(30):
            await host.ready.wait()
        try:
            yield host
        finally:
            stop.set()


def connector(folder, name: str, **fields: Any):
    return scripted(name, {"manifest": fields.pop("manifest", MANIFEST), "steps": []}, folder,
                    grant=fields.pop("grant", GRANT), **fields)


async def test_nothing_is_streamed_before_routing_is_decided(tmp_path) -> None:
    """Text before open() is held (never sent on its own), and a streamer never opened sends nothing at all."""
    async with streaming_host(tmp_path, connector(tmp_path, "disc")) as host:
        async with Streamer(host.connectors, "inf-never") as never:
            never.chunk("unrouted words")
        async with Streamer(host.connectors, "inf-1") as streamer:
            streamer.chunk("held ")
            streamer.chunk("back")
            assert streamer.index == 0  # nothing went out yet
            streamer.open([Destination(server_id="disc", channel_id="room")])
            streamer.chunk(" then more")
        await wait_for(lambda: any(m["method"] == COMPLETE for m in outgoing(tmp_path, "disc", "inf-1")))
    assert outgoing(tmp_path, "disc", "inf-never") == []
    sent = outgoing(tmp_path, "disc", "inf-1")
    chunks = [m["params"] for m in sent if m["method"] != COMPLETE]
    assert chunks[0]["delta"].startswith("held back")  # the held text leads the first chunk, sent after open()
    assert "".join(c["delta"] for c in chunks) == "held back then more"
    assert sent[-1]["params"]["content"] == [{"type": "text", "text": "held back then more"}]


async def test_an_aborted_turn_completes_each_channel_once_and_indexes_rise_across_channels(tmp_path) -> None:
    """Cancelled mid-stream, every channel that got a chunk gets one complete; the index is one counter."""
    specs = [connector(tmp_path, "disc"), connector(tmp_path, "zulip")]
    destinations = [Destination(server_id="disc", channel_id="a"), Destination(server_id="disc", channel_id="b"),
                    Destination(server_id="zulip", channel_id="s", thread_id="topic")]
    async with streaming_host(tmp_path, *specs) as host:
        with anyio.CancelScope() as turn:
            async with Streamer(host.connectors, "inf-abort") as streamer:
                streamer.open(destinations)
                streamer.chunk("one ")
                await wait_for(lambda: len(outgoing(tmp_path, "disc", "inf-abort")) >= 2)
                streamer.chunk("two")
                turn.cancel()  # the turn is aborted here
                await anyio.sleep_forever()
        assert turn.cancelled_caught

        def completes() -> list[dict[str, Any]]:
            return [m for name in ("disc", "zulip") for m in outgoing(tmp_path, name, "inf-abort")
                    if m["method"] == COMPLETE]

        await wait_for(lambda: len(completes()) == 3)
    every = [m for name in ("disc", "zulip") for m in outgoing(tmp_path, name, "inf-abort")]
    chunks = [m["params"] for m in every if m["method"] != COMPLETE]
    indexes = sorted(c["index"] for c in chunks)
    assert indexes == list(range(len(chunks)))  # one counter for the inference, no index twice
    by_channel: dict[str, list[dict[str, Any]]] = {}
    for c in chunks:
        by_channel.setdefault(c["channelId"], []).append(c)
    for channel, got in by_channel.items():
        ordered = sorted(got, key=lambda c: c["index"])
        text = "".join(c["delta"] for c in ordered)
        (complete,) = [m["params"] for m in every if m["method"] == COMPLETE and m["params"]["channelId"] == channel]
        assert complete["content"] == [{"type": "text", "text": text}]
    assert sorted(m["params"]["channelId"] for m in every if m["method"] == COMPLETE) == ["a", "b", "s"]
    zulip = next(c for c in chunks if c["channelId"] == "s")
    assert zulip["conversationId"] == destinations[2].conversation_id()


@pytest.mark.parametrize("offered", [True, False])
async def test_a_connector_without_the_streaming_grant_gets_nothing(tmp_path, offered: bool) -> None:
    """Not granted (policy leaves it out, or the host does not offer it): open() skips it, nothing is sent."""
    specs = [connector(tmp_path, "plain", grant=["channels.register"]), connector(tmp_path, "disc")]
    async with streaming_host(tmp_path, *specs, offered_streaming=offered) as host:
        async with Streamer(host.connectors, "inf-2") as streamer:
            opened = streamer.open([Destination(server_id="plain", channel_id="x"),
                                    Destination(server_id="disc", channel_id="y")])
            streamer.chunk("hello")
        if offered:
            assert opened == [Destination(server_id="disc", channel_id="y")]
            await wait_for(lambda: any(m["method"] == COMPLETE for m in outgoing(tmp_path, "disc", "inf-2")))
        else:
            assert opened == []
    assert outgoing(tmp_path, "plain") == []


class TestPinGuard:
    def test_streaming_stops_where_a_pin_line_begins(self) -> None:
        """A `>>>` line (after spaces) seals the stream at its start; an unfinished `>` line is held."""
        assert streamable_end("hello\nworld", 0) == (11, False)
        assert streamable_end("hello\n  >>> #other\nsecret", 0) == (6, True)
        assert streamable_end("hello\n>", 0) == (6, False)  # may still become a pin
        assert streamable_end("hello\n> quoted", 0) == (14, False)  # a quote, not a pin
        assert streamable_end(">>> x", 0) == (0, True)

    @given(st.lists(st.sampled_from(["a", " ", "\n", ">", ">>>", "b c", "\t"]), max_size=30))
    def test_the_streamed_prefix_never_holds_a_pin_line(self, pieces: list[str]) -> None:
        """Whatever the text, what may be streamed has no line opening with the pin mark."""
        text = "".join(pieces)
        end, sealed = streamable_end(text, 0)
        assert all(not line.lstrip(" \t").startswith(PIN_MARK) for line in text[:end].split("\n"))
        if any(line.lstrip(" \t").startswith(PIN_MARK) for line in text.split("\n")):
            assert sealed

    async def test_a_pin_in_the_streamed_text_ends_the_preview_there(self, tmp_path) -> None:
        """Words after a pin line are never streamed to the default channel; its complete has only what went."""
        async with streaming_host(tmp_path, connector(tmp_path, "disc")) as host:
            async with Streamer(host.connectors, "inf-pin") as streamer:
                streamer.open([Destination(server_id="disc", channel_id="room")])
                streamer.chunk("for the room\n>")
                streamer.chunk('>> "disc/other"\nnot for the room')
            await wait_for(lambda: any(m["method"] == COMPLETE for m in outgoing(tmp_path, "disc", "inf-pin")))
        sent = outgoing(tmp_path, "disc", "inf-pin")
        streamed = "".join(m["params"]["delta"] for m in sent if m["method"] != COMPLETE)
        assert streamed == "for the room\n"
        assert sent[-1]["params"]["content"] == [{"type": "text", "text": "for the room\n"}]


async def test_a_failed_turn_still_completes_and_its_error_propagates_as_it_is(tmp_path) -> None:
    """An exception in the turn ends the stream with its complete and reaches the caller unwrapped."""
    async with streaming_host(tmp_path, connector(tmp_path, "disc")) as host:
        with pytest.raises(ValueError, match="backend broke"):
            async with Streamer(host.connectors, "inf-fail") as streamer:
                streamer.open([Destination(server_id="disc", channel_id="room")])
                streamer.chunk("partial")
                raise ValueError("backend broke")
        await wait_for(lambda: any(m["method"] == COMPLETE for m in outgoing(tmp_path, "disc", "inf-fail")))
    completes = [m for m in outgoing(tmp_path, "disc", "inf-fail") if m["method"] == COMPLETE]
    assert [m["params"]["content"] for m in completes] == [[{"type": "text", "text": "partial"}]]


class _Speech:
    """What stream_targets reads of a turn's speech (agents/speech.TurnSpeech)."""

    def __init__(self, current: Any, views: list[ChannelView], *, published_default: bool = False,
                 moderated: bool = False) -> None:
        self.current = self.default = current
        self.published_default = published_default
        self.moderated = moderated
        self._views = views

    def views(self) -> list[ChannelView]:
        return self._views


class _Handle:
    """A ready connector holding `grant` (the part of a NotifyPort stream_targets reads)."""

    def __init__(self, grant: set[str]) -> None:
        self.state = State.READY
        self.grant = frozenset(grant)


def test_stream_targets_only_a_decided_publishable_route_not_yet_published() -> None:
    """Undecided, not publishable, or already published by channel_publish: nothing is streamed."""
    room = Destination(server_id="disc", channel_id="room")
    open_view = ChannelView(server_id="disc", channel_id="room", label="#room", direction="bidirectional",
                            publishable=True)
    closed_view = ChannelView(server_id="disc", channel_id="room", label="#room", direction="inbound",
                              publishable=False, refusal="inbound_only")
    handles = {"disc": _Handle({STREAMING})}
    assert stream_targets(_Speech(room, [open_view]), handles) == [room]
    assert stream_targets(_Speech(room, [open_view]), {"disc": _Handle(set())}) == []
    assert stream_targets(_Speech(room, [open_view]), {}) == []
    assert stream_targets(_Speech(room, [closed_view]), handles) == []
    assert stream_targets(_Speech(room, []), handles) == []
    assert stream_targets(_Speech(room, [open_view], published_default=True), handles) == []
    assert stream_targets(_Speech(Undecided(reason="several"), [open_view]), handles) == []
    assert stream_targets(None, handles) == []
    assert stream_targets(_Speech(room, [open_view], moderated=True), handles) == []  # docs/agents.md#moderation


ROOM = "disc:g1:room"
TURN_MANIFEST: dict[str, Any] = {
    "version": "0.5",
    "channels": {"register": True, "incoming": True, "publish": True, "streaming": True},
    "featureSets": {"chat": {"description": "chat", "uses": [
        "channels.register", "channels.incoming", "channels.publish", "channels.streaming"]}},
}


def turn_connector(folder, name: str, grant: list[str]):
    register = {"request": "channels/register", "params": {"channels": [
        {"id": ROOM, "type": "disc", "direction": "bidirectional", "address": {}, "label": "#room"}]}}
    mention = {"request": "channels/incoming", "params": {"messages": [
        {"channelId": ROOM, "messageId": "m-1", "author": {"id": "u-1", "name": "Ann"},
         "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": "scout?"}],
         "tags": ["chat:addressed"]}]}}
    script = {"manifest": TURN_MANIFEST, "steps": [register, mention],
              "handlers": {"channels/publish": {"result": {"delivered": True, "messageId": "out-1"}}}}
    return scripted(name, script, folder, grant=grant)


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_turn_streams_its_answer_to_the_conversation_it_answers(tmp_path, streaming: bool) -> None:
    """A turn's text is streamed (chunks, then one complete) where it is published, only under channels.streaming."""
    grant = ["channels.register", "channels.incoming", "channels.publish"] + (["channels.streaming"] * streaming)
    config = config_with(tmp_path, turn_connector(tmp_path, "disc", grant))
    config = Config(store=config.store, connectors=config.connectors, agents=[AgentConfig(
        name="scout", wake_on=["addressed"], debounce_ms=0, backend=BackendConfig(kind="scripted",
                                                                                   script=["hello, Ann"]))])
    async with running_host(config):
        def published() -> list[dict[str, Any]]:
            return [m for m in record(tmp_path, "disc").received if m.get("method") == "channels/publish"]

        await wait_for(published, timeout=30)
    sent = outgoing(tmp_path, "disc")
    if not streaming:
        assert sent == []
        return
    chunks = [m["params"] for m in sent if m["method"] != COMPLETE]
    completes = [m["params"] for m in sent if m["method"] == COMPLETE]
    assert "".join(c["delta"] for c in chunks) == "hello, Ann" and {c["channelId"] for c in chunks} == {ROOM}
    (complete,) = completes
    assert complete["content"] == [{"type": "text", "text": "hello, Ann"}]
    assert complete["conversationId"] == Destination(server_id="disc", channel_id=ROOM).conversation_id()
    assert published()[0]["params"]["channelId"] == ROOM  # chunks are advisory: the publish still delivers
