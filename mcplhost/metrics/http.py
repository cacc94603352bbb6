"""The `/metrics` endpoint: a few lines of HTTP/1.x served on the event loop, one request per connection.

prometheus_client's own server runs in a thread; this one runs on the
loop, so a scrape reads the components' counters between two of the loop's
steps, never halfway through one. It answers only `GET /metrics` (and
HEAD), and treats every client as hostile (docs/operations.md#metrics): the
request head is read up to `MAX_HEAD_BYTES` within `HEAD_TIMEOUT_S` of the
connection (a scraper sends it at once; an idle or trickling client loses
its place within that second), the whole exchange takes at most
`REQUEST_TIMEOUT_S`, at most `MAX_CLIENTS` are served at once, and the
connection is closed after each answer. So slow local clients, however
they pace their bytes, hold a place for a second each and take a few of
many: a scrape beside two dozen of them is answered at once.
`parse_head` is the pure part: bytes in, a decision out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
import regex
import structlog
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

log = structlog.get_logger()

#: The request line and headers together; Prometheus sends a few hundred bytes (h11 and nginx allow 8 KiB+).
MAX_HEAD_BYTES = 8192
#: A client must have sent its whole request head within this time of connecting (Prometheus sends it at once).
HEAD_TIMEOUT_S = 1.0
#: A client must have sent its whole request head and taken the answer within this time.
REQUEST_TIMEOUT_S = 5.0
#: Clients served at once; a further one gets 503 at once. Prometheus scrapes one at a time: the rest are
#: room for clients that hold a place without asking, each for HEAD_TIMEOUT_S at most.
MAX_CLIENTS = 64
#: The one path served.
METRICS_PATH = "/metrics"
#: Read per receive call.
RECEIVE_BYTES = 4096

#: RFC 9112 §3: request-line = method SP request-target SP HTTP-version (a token, an origin-form target).
_REQUEST_LINE = regex.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+) (/[\x21-\x7e]*) HTTP/1\.[01]")

REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           414: "URI Too Long", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


class Answer(msgspec.Struct, frozen=True):
    """What to answer a request head: a status, and whether the metrics body goes with it (GET) or only its
    headers (HEAD)."""

    status: int
    body: bool = False


def parse_head(head: bytes) -> Answer:
    """The answer to one request head (without its final blank line); pure, any bytes accepted."""
    line = head.split(b"\r\n", 1)[0]
    match = _REQUEST_LINE.fullmatch(line)
    if match is None:
        return Answer(400)
    method, target = match.group(1), match.group(2)
    if target.split(b"?", 1)[0] != METRICS_PATH.encode():
        return Answer(404)
    if method not in (b"GET", b"HEAD"):
        return Answer(405)
    return Answer(200, body=method == b"GET")


def response(status: int, body: bytes = b"", content_type: str = "text/plain; charset=utf-8", *,
             length: int | None = None) -> bytes:
    """A complete HTTP/1.1 response that closes the connection (`length`: Content-Length of a HEAD's body)."""
    text = body if body or status == 200 else f"{REASONS[status]}\n".encode()
    headers = (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {content_type}\r\n"
               f"Content-Length: {len(text) if length is None else length}\r\nConnection: close\r\n")
    if status == 405:
        headers += "Allow: GET, HEAD\r\n"
    return headers.encode("ascii") + b"\r\n" + text


async def read_head(stream: SocketStream) -> bytes | int:
    """The request head, or the status refusing it (414 / 431 when too long, 400 when the client went away)."""
    buffered = BufferedByteReceiveStream(stream)
    try:
        return await buffered.receive_until(b"\r\n\r\n", MAX_HEAD_BYTES)
    except anyio.DelimiterNotFound:
        return 431 if b"\r\n" in buffered.buffer else 414
    except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
        return 400


Render = Callable[[], Awaitable[tuple[bytes, str]]]


async def serve_client(stream: SocketStream, render: Render, limiter: anyio.CapacityLimiter,
                       events: Any = log) -> None:
    """Answer one client and close; never raises (a client's failure is its own). `events` logs what clients
    cause (Metrics passes a LimitedLog: a client decides how often it times out)."""
    async with stream:
        try:
            limiter.acquire_nowait()
        except anyio.WouldBlock:
            await _send(stream, response(503))
            return
        try:
            with anyio.move_on_after(REQUEST_TIMEOUT_S) as scope:
                with anyio.move_on_after(HEAD_TIMEOUT_S) as waiting:
                    head = await read_head(stream)
                if waiting.cancelled_caught:
                    events.info("metrics.client_timeout", timeout_s=HEAD_TIMEOUT_S, waiting_for="request head")
                    return
                if isinstance(head, int):
                    await _send(stream, response(head))
                    return
                answer = parse_head(head)
                if answer.status != 200:
                    await _send(stream, response(answer.status))
                    return
                body, content_type = await render()
                await _send(stream, response(200, body if answer.body else b"", content_type, length=len(body)))
            if scope.cancelled_caught:
                events.info("metrics.client_timeout", timeout_s=REQUEST_TIMEOUT_S)
        finally:
            limiter.release()


async def _send(stream: SocketStream, data: bytes) -> None:
    try:
        await stream.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass  # the client went away: nothing more to tell it
