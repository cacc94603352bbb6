"""The live parts as server-sent events: the feed's lines and the overview's status (docs/operations.md#console).

Each stream is bounded on its own (the guard's per-request time bound does
not apply to them):

- at most MAX_STREAMS open at once; one more is answered 503;
- every write must be taken by the client within SEND_TIMEOUT_S, or the
  stream ends: a client that stops reading is dropped, never buffered for
  (the feed also drops a subscriber that falls SUBSCRIBER_BUFFER lines
  behind, mcplhost/console/feed.py);
- a comment every KEEPALIVE_S finds a client that went away.

The browser's EventSource reconnects by itself (after RETRY_MS) and says
the last line it had (`Last-Event-ID`), so a dropped feed catches up from
the feed's ring. Every text is redacted of the host's secrets before it is
sent; the page's script puts it in with `textContent`.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
from starlette.datastructures import Headers, QueryParams
from starlette.types import Message, Receive, Scope, Send

from mcplhost.secrets import Secrets

from .feed import SUBSCRIBER_BUFFER, Feed, FeedLine
from .views import Views

#: Live streams (feed and status together) open at once.
MAX_STREAMS = 8
#: A client must take each write within this time, or its stream ends.
SEND_TIMEOUT_S = 5.0
#: A comment line this often when nothing else is sent.
KEEPALIVE_S = 15.0
#: How often the overview's status is sent.
STATUS_INTERVAL_S = 2.0
#: The reconnection delay the browser is told.
RETRY_MS = 1000

_encoder = msgspec.json.Encoder()
_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"x-accel-buffering", b"no")]


class _Gone(Exception):
    """The client left, or did not take a write in time."""


class _Stream:
    """The shared part: the cap, the response head, bounded writes, and ending when the client leaves."""

    def __init__(self, secrets: Secrets, *, max_streams: int = MAX_STREAMS, send_timeout_s: float = SEND_TIMEOUT_S,
                 keepalive_s: float = KEEPALIVE_S) -> None:
        self.secrets = secrets
        self.max_streams = max_streams
        self.send_timeout_s = send_timeout_s
        self.keepalive_s = keepalive_s
        self.open = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.open >= self.max_streams:
            body = b"too many live views are open; close one\n"
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
            await send({"type": "http.response.body", "body": body})
            return
        self.open += 1
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
            await self._write(send, f"retry: {RETRY_MS}\n\n".encode())
            async with anyio.create_task_group() as tg:
                tg.start_soon(_until_gone, receive, tg.cancel_scope)
                try:
                    await self.events(scope, send)
                except _Gone:
                    pass
                tg.cancel_scope.cancel()
            with anyio.move_on_after(self.send_timeout_s):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (_Gone, OSError):
            pass
        finally:
            self.open -= 1

    async def events(self, scope: Scope, send: Send) -> None:
        raise NotImplementedError

    async def _write(self, send: Send, data: bytes) -> None:
        with anyio.move_on_after(self.send_timeout_s) as scope:
            try:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            except OSError as exc:
                raise _Gone from exc
        if scope.cancelled_caught:
            raise _Gone

    def event_bytes(self, name: str, data: Any, event_id: int | None = None) -> bytes:
        """One event: its id (what a reconnecting client says it had), its name, its data as JSON, redacted."""
        payload = _encoder.encode(self.secrets.redact_json(data) if self.secrets else data)
        head = f"id: {event_id}\n" if event_id is not None else ""
        return f"{head}event: {name}\ndata: ".encode() + payload + b"\n\n"


async def _until_gone(receive: Receive, scope: anyio.CancelScope) -> None:
    """Wait for the client's disconnect, then end its stream."""
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


class FeedEvents(_Stream):
    """`/feed/events`: the feed's lines after the one the client last had (Last-Event-ID, or `?after=`)."""

    def __init__(self, feed: Feed, secrets: Secrets, *, max_streams: int = MAX_STREAMS,
                 send_timeout_s: float = SEND_TIMEOUT_S, keepalive_s: float = KEEPALIVE_S) -> None:
        super().__init__(secrets, max_streams=max_streams, send_timeout_s=send_timeout_s, keepalive_s=keepalive_s)
        self.feed = feed

    async def events(self, scope: Scope, send: Send) -> None:
        last = Headers(scope=scope).get("last-event-id") or QueryParams(scope["query_string"]).get("after") or "0"
        lines = self.feed.subscribe(int(last) if last.isdigit() and len(last) < 19 else 0)
        try:
            while True:
                line: FeedLine | None = None
                with anyio.move_on_after(self.keepalive_s):
                    try:
                        line = await lines.receive()
                    except anyio.EndOfStream:  # dropped, or the console stops: the browser reconnects
                        return
                if line is None:
                    await self._write(send, b": keepalive\n\n")
                    continue
                batch = [line]  # and whatever else is waiting: one write for them all
                while len(batch) < SUBSCRIBER_BUFFER:
                    try:
                        batch.append(lines.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await self._write(send, b"".join(self.event_bytes("line", msgspec.to_builtins(one), one.seq)
                                                 for one in batch))
        finally:
            self.feed.unsubscribe(lines)


class StatusEvents(_Stream):
    """`/status/events`: the status object (as `status --json` prints it) every STATUS_INTERVAL_S."""

    def __init__(self, views: Views, secrets: Secrets, *, max_streams: int = MAX_STREAMS,
                 send_timeout_s: float = SEND_TIMEOUT_S, keepalive_s: float = KEEPALIVE_S) -> None:
        super().__init__(secrets, max_streams=max_streams, send_timeout_s=send_timeout_s, keepalive_s=keepalive_s)
        self.views = views

    async def events(self, scope: Scope, send: Send) -> None:
        while True:
            await self._write(send, self.event_bytes("status", await self.views.status()))
            await anyio.sleep(STATUS_INTERVAL_S)
