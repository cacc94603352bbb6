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
from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.config import AgentConfig, BackendConfig, Config
from mcplhost.host import Host, open_host
from mcplhost.secrets import NO_SECRETS, Secrets
from mcplhost.speech.routing import PIN_MARK, ChannelView, Destination, Undecided
from mcplhost.speech.streaming import COMPLETE, LINE_BREAKS, STREAMING, PinGuard, Streamer, stream_targets
from mcplhost.supervisor.handle import State

from ..harness import config_with, record, scripted, wait_for
from ..memory_pair import memory_host
from ..properties import examples

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


def reference_end(text: str) -> tuple[int, bool]:
    """The pin rule over a whole text, written plainly with routing's own line split: what PinGuard must equal."""
    start = 0
    for line in text.splitlines(keepends=True):
        opening = line.lstrip()
        if opening.startswith(PIN_MARK):
            return start, True
        if line[-1] not in LINE_BREAKS:  # the unfinished last line: held while it may still become a pin
            return (start if PIN_MARK.startswith(opening) else len(text)), False
        start += len(line)
    return start, False  # empty, or ending with a line break: the next line has not begun


def whole(text: str) -> tuple[int, bool]:
    guard = PinGuard()
    guard.feed(text)
    return guard.end, guard.sealed


def split(text: str, cuts: list[int]) -> list[str]:
    """`text` in pieces, cut at `cuts` (taken modulo its length + 1)."""
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)]) if b > a]


#: Pieces of text that exercise the pin rule: blanks and line breaks of every kind routing knows, the mark and its
#: prefixes, a long blank run.
PIECES = st.sampled_from(["a", " ", "\n", ">", ">>>", "b c", "\t", "\r", "\r\n", "\u2028", "\u00a0", "\x0b",
                          " " * 70, "x" * 70])


class _Port:
    """A ready connector holding channels.streaming that keeps what it is sent (for properties that run thousands
    of streams; the same Streamer against real connectors is tested above)."""

    def __init__(self) -> None:
        self.state = State.READY
        self.grant = frozenset({STREAMING})
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        self.sent.append((method, params))


ROOM_DESTINATION = Destination(server_id="disc", channel_id="room")


async def stream(pieces: list[str], secrets: Secrets = NO_SECRETS) -> list[tuple[str, dict[str, Any]]]:
    """What one connector is sent when `pieces` are streamed to it, the sender running between pieces."""
    port = _Port()
    async with Streamer({"disc": port}, "inf-1", secrets=secrets) as streamer:  # type: ignore[dict-item]
        streamer.open([ROOM_DESTINATION])
        for piece in pieces:
            streamer.chunk(piece)
            await anyio.sleep(0)  # let the sender run between chunks, as the backend's reads do
    return port.sent


def streamed_text(sent: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(p.get("delta", "") for m, p in sent if m != COMPLETE)


#: A secret none of PIECES can spell: the stream holds back its length − 1 characters all along, then lets go.
UNSPELLED = Secrets({"SOME_TOKEN": "zz-never-in-the-text"})


class TestPinGuard:
    def test_streaming_stops_where_a_pin_line_begins(self) -> None:
        """A `>>>` line (after spaces) seals the stream at its start; an unfinished `>` line is held."""
        assert whole("hello\nworld") == (11, False)
        assert whole("hello\n  >>> #other\nsecret") == (6, True)
        assert whole("hello\n>") == (6, False)  # may still become a pin
        assert whole("hello\n> quoted") == (14, False)  # a quote, not a pin
        assert whole(">>> x") == (0, True)
        assert whole("hello\r>>> #other\rsecret") == (6, True)  # routing splits lines at \r too
        assert whole("hello\n\u00a0>>> #other") == (6, True)  # and strips any blank
        assert whole("hello\n" + " " * 500) == (6, False)  # a blank line may still become a pin, however long

    @given(st.lists(PIECES, max_size=30))
    def test_the_streamed_prefix_never_holds_a_pin_line(self, pieces: list[str]) -> None:
        """Whatever the text, what may be streamed has no line opening with the pin mark."""
        text = "".join(pieces)
        end, sealed = whole(text)
        assert all(not line.lstrip().startswith(PIN_MARK) for line in text[:end].splitlines())
        if any(line.lstrip().startswith(PIN_MARK) for line in text.splitlines()):
            assert sealed

    @given(st.lists(PIECES, max_size=30), st.lists(st.integers(0, 400), max_size=10))
    def test_fed_in_any_pieces_the_guard_says_what_the_whole_text_says(self, pieces: list[str],
                                                                         cuts: list[int]) -> None:
        """After every piece, the guard's end and seal are the plain rule's over the text so far: feeding piece by
        piece (each piece read once) changes nothing."""
        text = "".join(pieces)
        guard, fed = PinGuard(), ""
        for piece in split(text, cuts):
            fed += piece
            guard.feed(piece)
            assert (guard.end, guard.sealed) == reference_end(fed)

    @settings(max_examples=examples(50), deadline=None)
    @given(st.lists(PIECES, max_size=30), st.lists(st.integers(0, 400), max_size=10), st.booleans())
    def test_streamed_in_any_chunks_the_output_is_the_unstreamed_one(self, pieces: list[str], cuts: list[int],
                                                                    with_secrets: bool) -> None:
        """Whatever the chunking (and with a secret's hold-back or without), the deltas join to what the whole
        text streamed at once gives, which is the text up to where the pin rule stops it; the complete says the
        same."""
        text = "".join(pieces)
        secrets = UNSPELLED if with_secrets else NO_SECRETS
        chunked = anyio.run(stream, split(text, cuts), secrets)
        at_once = anyio.run(stream, [text] if text else [], secrets)
        expected = text[: reference_end(text)[0]]
        assert streamed_text(chunked) == streamed_text(at_once) == expected
        completes = [p["content"][0]["text"] for m, p in chunked if m == COMPLETE]
        assert completes == ([expected] if expected else [])

    async def test_a_long_line_in_small_chunks_is_never_held_whole(self) -> None:
        """Streaming one 320 kB line in 8-character chunks keeps only the newest piece and a secret's length held:
        no chunk's work grows with the line so far (docs/agents.md#bounds)."""
        port = _Port()
        held: list[int] = []
        async with Streamer({"disc": port}, "inf-long", secrets=UNSPELLED) as streamer:  # type: ignore[dict-item]
            streamer.open([ROOM_DESTINATION])
            for _ in range(40_000):
                streamer.chunk("abcdefgh")
                held.append(sum(map(len, streamer._held)))
        assert max(held) < UNSPELLED.longest + 8
        assert len(streamed_text(port.sent)) == 320_000

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
    async with memory_host(config):
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
