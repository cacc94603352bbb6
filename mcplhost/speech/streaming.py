"""Streaming a turn's text: `channels/outgoing/chunk` and `/complete` (MCPL spec, channels/outgoing).

A `Streamer` serves one inference. It sends nothing until `open(destinations)`
says routing is decided; text the backend streamed before that is held and
goes out as the first chunk once it opens. Only destinations whose connector
is ready and holds `channels.streaming` now are streamed to (the grant holds
only what the connector declared, so granted means declared too).

- `chunk(text)` is the backend's synchronous `on_text`: each piece goes to
  every open channel, in order, each notification with the next value of one
  index shared by the whole inference, so the index rises across channels and
  joining one channel's deltas in index order rebuilds its text.
- Leaving `async with Streamer(...)` (the turn finished, failed, or was
  cancelled) sends `complete` exactly once per channel that got at least one
  chunk, with the text that channel was streamed, shielded and bounded
  (`COMPLETE_TIMEOUT_S`), so an aborted turn still ends its streams.

A `>>> DEST` pin line may send the words after it elsewhere, so streaming
stops where such a line begins (`streamable_end`): a preview never shows a
channel words routed to another. Chunks are advisory: delivery is only ever the outbox's `channels/publish`.
A connector that cannot take a notification costs its own stream (logged),
never the turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Protocol

import anyio
import structlog

from mcplhost.protocol.ports import NotifyPort, State
from mcplhost.secrets import NO_SECRETS, Secrets
from mcplhost.speech.routing import PIN_MARK, ChannelView, Destination, Undecided

log = structlog.get_logger()

STREAMING = "channels.streaming"
CHUNK = "channels/outgoing/chunk"
COMPLETE = "channels/outgoing/complete"
#: A line start held while it could still become a pin is released past this many spaces.
MAX_HELD_LINE_CHARS = 64
#: The completes of one inference, all together, may take this long at exit (they are queued, not answered).
COMPLETE_TIMEOUT_S = 2.0


def streamable_end(text: str, start: int) -> tuple[int, bool]:
    """How much of `text` may be streamed, scanning lines from the one holding `start`; and whether a pin began.

    A line whose text (after spaces) opens with the pin mark may re-route
    what follows (speech/routing.py), so streaming stops at its start for
    good: a preview never shows words meant for another channel. An
    unfinished last line that could still become one is held.
    """
    line_start = text.rfind("\n", 0, start) + 1
    while True:
        newline = text.find("\n", line_start)
        line = text[line_start:] if newline < 0 else text[line_start:newline]
        opening = line.lstrip(" \t")
        if opening.startswith(PIN_MARK):
            return line_start, True
        if newline < 0:
            held = PIN_MARK.startswith(opening) and len(line) < MAX_HELD_LINE_CHARS
            return (line_start if held else len(text)), False
        line_start = newline + 1


class TurnRouting(Protocol):
    """What streaming reads of a turn's routing (mcplhost/agents/speech.py `TurnSpeech` implements it)."""

    current: Destination | Undecided
    default: Destination | Undecided
    published_default: bool
    moderated: bool  # `[moderation]` is on: a segment is checked whole, so nothing streams (docs/agents.md#moderation)

    def views(self) -> list[ChannelView]: ...


def stream_targets(speech: TurnRouting | None, handles: Mapping[str, NotifyPort]) -> list[Destination]:
    """Where a turn's next inference may be streamed: where its unpinned prose goes now (agents/speech.TurnSpeech).

    Nothing with moderation on (a chunk cannot be unsent once its segment is
    refused), nothing while routing is undecided, when that connector cannot be
    streamed to, when the channel is not publishable now (routing would
    draft it), or when `channel_publish` already reached the default
    destination (the prose will not be published there again).
    """
    if speech is None or speech.moderated:  # not read its waking items yet, or every segment is checked whole
        return []
    current = speech.current
    if not isinstance(current, Destination) or not streamable(handles.get(current.server_id)):
        return []
    if speech.published_default and current == speech.default:
        return []
    publishable = any(v.server_id == current.server_id and v.channel_id == current.channel_id and v.publishable
                      for v in speech.views())
    return [current] if publishable else []


def streamable(handle: NotifyPort | None) -> bool:
    """Whether a connector may be streamed to now: it serves (ready) and holds channels.streaming."""
    return handle is not None and handle.state is State.READY and STREAMING in handle.grant


class _Channel:
    __slots__ = ("conversation_id", "destination", "failed", "sent", "text")

    def __init__(self, destination: Destination) -> None:
        self.destination = destination
        self.conversation_id = destination.conversation_id()
        self.text: list[str] = []  # what this channel was sent, in order
        self.sent = 0  # chunks that went out
        self.failed = False  # a send failed: nothing more goes to it, complete still does if any chunk went


class Streamer:
    """The streams of one inference (`inference_id`) to the channels routing chose."""

    def __init__(self, handles: Mapping[str, NotifyPort], inference_id: str, *,
                 secrets: Secrets = NO_SECRETS) -> None:
        self._handles = handles
        #: Never streamed (docs/agents.md#secrets): a tail that may be a secret's start is held back, and once one
        #: is seen nothing more of this inference is streamed.
        self._secrets = secrets
        self.inference_id = inference_id
        self._channels: list[_Channel] | None = None  # None until open()
        self._text: list[str] = []  # everything the backend streamed, in order
        self._released = 0  # characters of it handed to the sender (the rest is held)
        self._searched = 0  # characters of it already searched for a secret: only what follows is searched again
        self._sealed = False  # a pin line began: nothing more is streamed in this inference
        self._queue: list[str] = []  # text waiting for the sender task
        self._wake = anyio.Event()
        self._drained = anyio.Event()  # set once the sender has sent everything queued before the close
        self._closing = False
        self._lock = anyio.Lock()
        self._completed = False  # the completes are (being) sent: no chunk after them
        self.index = 0  # the next chunk's index, shared by every channel of this inference
        self._task_group = anyio.create_task_group()  # entered by __aenter__: a Streamer is used once

    # --- what the turn calls -----------------------------------------------------

    def open(self, destinations: Iterable[Destination]) -> list[Destination]:
        """Routing is decided: stream to these (the streamable ones); the destinations streamed to.

        Called once; a later call changes nothing (logged).
        """
        if self._channels is not None:
            log.info("speech.stream_reopen_ignored", inferenceId=self.inference_id)
            return [c.destination for c in self._channels]
        unique = list(dict.fromkeys(destinations))
        self._channels = [_Channel(d) for d in unique if streamable(self._handles.get(d.server_id))]
        self._release()
        return [c.destination for c in self._channels]

    def chunk(self, text: str) -> None:
        """One piece of streamed text (the backend's `on_text`); never blocks, never raises."""
        if not text or self._closing:
            return
        self._text.append(text)
        if self._channels:
            self._release()

    def _release(self, *, final: bool = False) -> None:
        """Queue what may be streamed now: up to the first line that is or may become a `>>>` pin, and short of
        the last (longest secret − 1) characters, which may begin a secret the next chunk completes (`final`: the
        inference ended, nothing can complete it)."""
        if self._sealed or not self._channels:
            return
        whole = "".join(self._text)
        self._text = [whole]
        limit = len(whole)
        if self._secrets:
            # A secret not wholly inside what was searched ends after it, so it starts at most longest − 1 before.
            secret = self._secrets.find(whole[max(0, self._searched - self._secrets.longest + 1):])
            self._searched = len(whole)
            if secret is not None:
                self._sealed = True
                log.info("speech.stream_withheld", inferenceId=self.inference_id, reason="secret", variable=secret)
                return
            if not final:
                limit -= self._secrets.longest - 1
        end, sealed = streamable_end(whole, self._released)
        if end > limit:
            end, sealed = limit, False  # held back, not sealed: the rest is judged with the next chunk
        if end > self._released:
            self._queue.append(whole[self._released:end])
            self._released = end
            self._wake.set()
        self._sealed = sealed

    # --- lifetime --------------------------------------------------------------------

    async def __aenter__(self) -> Streamer:
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._send_loop)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        if self._secrets and exc_type is None:
            self._release(final=True)  # the held-back tail, unless it completes a secret
        self._closing = True
        self._wake.set()
        with anyio.CancelScope(shield=True):
            # The sender drains what is queued (bounded), then every stream gets its one complete.
            with anyio.move_on_after(COMPLETE_TIMEOUT_S):
                await self._drained.wait()
            with anyio.move_on_after(COMPLETE_TIMEOUT_S) as bound:
                async with self._lock:  # never between a chunk's sends; no chunk after this
                    self._completed = True
                    await self._complete_all()
            if bound.cancelled_caught:
                log.warning("speech.stream_complete_timeout", inferenceId=self.inference_id,
                            timeout_s=COMPLETE_TIMEOUT_S)
        self._task_group.cancel_scope.cancel()
        # The body's own exception is not the sender's: it propagates as it is, never inside a group.
        await self._task_group.__aexit__(None, None, None)
        return None

    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            while self._queue:
                async with self._lock:
                    if self._completed:
                        return
                    text, self._queue = "".join(self._queue), []
                    await self._send_chunk(text)
            if self._closing:
                self._drained.set()
                return

    async def _send_chunk(self, text: str) -> None:
        for channel in self._channels or []:
            if channel.failed:
                continue
            params = {"inferenceId": self.inference_id, "conversationId": channel.conversation_id,
                      "channelId": channel.destination.channel_id, "index": self.index, "delta": text}
            self.index += 1
            if await self._notify(channel, CHUNK, params):
                channel.text.append(text)
                channel.sent += 1

    async def _complete_all(self) -> None:
        for channel in self._channels or []:
            if channel.sent == 0:
                continue  # complete goes only where a chunk went
            text = "".join(channel.text)
            params = {"inferenceId": self.inference_id, "conversationId": channel.conversation_id,
                      "channelId": channel.destination.channel_id, "content": [{"type": "text", "text": text}]}
            channel.failed = False  # one try even after a failed chunk: the connector may be back
            await self._notify(channel, COMPLETE, params)

    async def _notify(self, channel: _Channel, method: str, params: dict[str, Any]) -> bool:
        try:
            await self._handles[channel.destination.server_id].notify(method, params)  # gone since: a failed send
        except Exception:
            channel.failed = True
            log.info("speech.stream_send_failed", inferenceId=self.inference_id, method=method,
                     connector=channel.destination.server_id, channel=channel.destination.channel_id, exc_info=True)
            return False
        return True
