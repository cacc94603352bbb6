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
stops where such a line begins (`PinGuard`): a preview never shows a
channel words routed to another. Chunks are advisory: delivery is only ever the outbox's `channels/publish`.
A connector that cannot take a notification costs its own stream (logged),
never the turn.

Each chunk costs its own length, never the text so far (docs/agents.md#streaming):
the pin rule and the secret search look only at what is new plus a bounded
window before it, and only what has not been sent yet is held.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Protocol

import anyio
import structlog

from mcplhost.protocol.ports import NOTIFY_FAILURES, NotifyPort, State
from mcplhost.secrets import NO_SECRETS, Secrets
from mcplhost.speech.routing import PIN_MARK, ChannelView, Destination, Route, Undecided

log = structlog.get_logger()

#: A send that did not go out: the port's refusals, or a connector gone from the map since (a reload).
_SEND_FAILURES: tuple[type[Exception], ...] = (KeyError, *NOTIFY_FAILURES)

STREAMING = "channels.streaming"
CHUNK = "channels/outgoing/chunk"
COMPLETE = "channels/outgoing/complete"
#: The completes of one inference, all together, may take this long at exit (they are queued, not answered).
COMPLETE_TIMEOUT_S = 2.0
#: What ends a line for `str.splitlines`, which routing reads pins with (speech/routing.py `route_prose`).
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LINE_BREAK = re.compile(f"[{LINE_BREAKS}]")
_BLANKS = re.compile(f"[^\\S{LINE_BREAKS}]*")  # whitespace that does not end a line


class PinGuard:
    """Where a text fed piece by piece may be streamed up to, by the pin rule; linear in what is fed.

    A line whose text (after blanks) opens with the pin mark may re-route what
    follows (speech/routing.py), so streaming stops at its start for good
    (`sealed`): a preview never shows words meant for another channel. Lines
    are what routing splits (`str.splitlines`: `\\r`, `\\v`, `\\u2028` ... break a
    line too) and blanks any other whitespace, as routing strips it. The last
    line is held while it is blanks and a prefix of the mark, since it could
    still become a pin. Only that line's opening (at most the mark's length)
    is kept between pieces, so each piece costs its own length and nothing is
    read twice; and `end` only grows, so the pieces a text comes in change
    nothing (`feed(a); feed(b)` ends where `feed(a + b)` does).
    """

    __slots__ = ("_line_start", "_opening", "_received", "_watching", "end", "sealed")

    def __init__(self) -> None:
        self.end = 0  # text before this may be streamed
        self.sealed = False  # a pin line begins at `end`: nothing from there on is ever streamed
        self._received = 0
        self._line_start = 0  # where the current (last) line begins
        self._opening = ""  # its first characters after blanks, while they may still open the pin mark
        self._watching = True  # the current line may still turn out a pin

    def feed(self, piece: str) -> int:
        """Take the next piece; the new `end`."""
        base, self._received = self._received, self._received + len(piece)
        i, n = 0, len(piece)
        while i < n and not self.sealed:
            if not self._watching:  # this line is decided: it runs to its line break
                found = _LINE_BREAK.search(piece, i)
                if found is None:
                    break
                i = found.end()
                self._next_line(base + i)
                continue
            if not self._opening:
                blanks = _BLANKS.match(piece, i)  # leading blanks decide nothing (`*`: it always matches)
                i = i if blanks is None else blanks.end()
                if i == n:
                    break
            char = piece[i]
            i += 1
            if char in LINE_BREAKS:
                self._next_line(base + i)  # the line ended without opening a pin
                continue
            self._opening += char
            if self._opening.startswith(PIN_MARK):
                self.sealed, self.end = True, self._line_start
            elif not PIN_MARK.startswith(self._opening):
                self._watching = False
        if not self.sealed:
            self.end = self._line_start if self._watching else self._received
        return self.end

    def _next_line(self, start: int) -> None:
        self._line_start, self._opening, self._watching = start, "", True


class TurnRouting(Protocol):
    """What streaming reads of a turn's routing (mcplhost/agents/turns/reply.py `TurnSpeech` implements it)."""

    current: Route  # a refused pin holds too: then nothing streams
    default: Destination | Undecided
    published_default: bool

    @property
    def moderated(self) -> bool:
        """`[moderation]` is on: a segment is checked whole, so nothing streams (docs/agents.md#moderation)."""

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
        # Positions count the characters the backend streamed, in order; nothing is kept of what went out.
        self._received = 0
        self._released = 0  # characters handed to the sender
        self._held: list[str] = []  # what follows them and may still go (never past a pin line's start)
        self._guard = PinGuard()
        self._tail = ""  # the last (longest secret − 1) characters received: where a secret the next piece ends begins
        self._withheld = False  # a secret was seen: nothing more of this inference is streamed
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
        """One piece of streamed text (the backend's `on_text`); never blocks, never raises.

        Costs the piece's own length (docs/agents.md#bounds): the pin rule and the secret search look only at
        what is new, plus the current line's opening and the last (longest secret − 1) characters.
        """
        if not text or self._closing or self._withheld:
            return
        if self._secrets and self._holds_secret(text):
            return
        start, self._received = self._received, self._received + len(text)
        limit = self._guard.end if self._guard.sealed else self._guard.feed(text)
        if self._channels == []:
            return  # opened with nowhere to stream to: nothing to keep
        if self._guard.sealed:
            text = text[: max(0, limit - start)]  # nothing past a pin line's start is ever streamed
        if text:
            self._held.append(text)
        if self._channels:
            self._release()

    def _holds_secret(self, text: str) -> bool:
        """Whether a secret ends in `text` (searched with the tail before it); if so nothing more is streamed."""
        window = self._tail + text
        keep = self._secrets.longest - 1
        self._tail = window[-keep:] if keep > 0 else ""
        secret = self._secrets.find(window)
        if secret is None:
            return False
        self._withheld = True
        self._held = []
        log.info("speech.stream_withheld", inferenceId=self.inference_id, reason="secret", variable=secret)
        return True

    def _release(self, *, final: bool = False) -> None:
        """Queue what may be streamed now: up to the first line that is or may become a `>>>` pin, and short of
        the last (longest secret − 1) characters, which may begin a secret the next chunk completes (`final`: the
        inference ended, nothing can complete it)."""
        if self._withheld or not self._channels:
            return
        end = self._guard.end
        if self._secrets and not final:
            end = min(end, self._received - (self._secrets.longest - 1))
        if end <= self._released:
            return
        held = "".join(self._held)  # small: a held line's start, a secret's length, and the newest piece
        count = end - self._released
        self._queue.append(held[:count])
        self._held = [held[count:]] if len(held) > count else []
        self._released = end
        self._wake.set()

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
            await self._handles[channel.destination.server_id].notify(method, params)
        except _SEND_FAILURES:
            channel.failed = True
            log.info("speech.stream_send_failed", inferenceId=self.inference_id, method=method,
                     connector=channel.destination.server_id, channel=channel.destination.channel_id, exc_info=True)
            return False
        return True
