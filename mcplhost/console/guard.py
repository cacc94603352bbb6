"""The ASGI layer around every console request: bounds, the security headers, the sign-in wall, the boundary.

In order, for each HTTP request (docs/operations.md#console):

1. at most MAX_REQUESTS in flight; one more is answered 503 at once;
2. a loopback console answers only a loopback Host (access.host_allowed: no DNS rebinding), else 421;
3. a body over MAX_BODY_BYTES is refused (413), by its Content-Length or as it arrives (a body is read
   whole, bounded, before the page sees it: the forms are small);
4. every response carries SECURITY_HEADERS (the CSP, X-Frame-Options, nosniff, no referrer to another
   site): the server adds them (server.py, so its own error answers have them too), and a page's own
   copy of one is removed here, so it can neither weaken nor double them;
5. with a token, a visitor without a session sees only the sign-in page and the static files;
6. a page (not a live stream, which has its own bounds) gets REQUEST_TIMEOUT_S, then 503;
7. an exception in a page is logged once and answered 500: one page's bug never reaches the server.

The token is never logged: nothing here logs a request's headers or body.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import structlog
from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .access import COOKIE, Gate, host_allowed

log = structlog.get_logger()

#: Requests served at once (pages, static files and live streams together); one more gets 503.
MAX_REQUESTS = 32
#: A request body: the sign-in and restart forms are a few hundred bytes.
MAX_BODY_BYTES = 16 * 1024
#: A page must be answered within this time (its reads are bounded; this bounds the rest).
REQUEST_TIMEOUT_S = 10.0
#: Paths served to a visitor who has not signed in.
PUBLIC_PREFIXES = ("/signin", "/static/")
#: The live streams: bounded by their own send timeout, not by REQUEST_TIMEOUT_S.
STREAM_PATHS = frozenset({"/feed/events", "/status/events"})

#: On every response. The pages load only their own files; no inline script, no frame, no sniffing.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                 b"connect-src 'self'; form-action 'self'; base-uri 'none'; object-src 'none'; "
                                 b"frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make a form's Origin "null"
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
#: Pages and streams are never cached (they show live state); the static files may be.
NO_STORE = (b"cache-control", b"no-store")


def session_id(scope: Scope) -> str | None:
    """The session cookie's value on a request, if any."""
    header = Headers(scope=scope).get("cookie")
    return cookie_parser(header).get(COOKIE) if header else None


class Guard:
    """The ASGI middleware of the module docstring, around the console's Starlette app."""

    def __init__(self, app: ASGIApp, gate: Gate, *, loopback: bool, clock: Callable[[], float] = time.monotonic,
                 max_requests: int = MAX_REQUESTS, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.app = app
        self.gate = gate
        self.loopback = loopback
        self.clock = clock
        self.max_requests = max_requests
        self.timeout_s = timeout_s
        self.active = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # the lifespan messages
            return
        started = False

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _OURS]
                if not scope["path"].startswith("/static/"):
                    headers.append(NO_STORE)
                message = {**message, "headers": headers}
            await send(message)

        if self.active >= self.max_requests:
            await _plain(guarded_send, 503, "the console is busy; try again")
            return
        self.active += 1
        try:
            await self._serve(scope, receive, guarded_send)
        except Exception:  # the boundary: one page's bug is that page's 500, never the server's end
            log.error("console.request_failed", path=scope["path"], exc_info=True)
            if not started:
                await _plain(guarded_send, 500, "internal error in the console (the daemon's log has it)")
        finally:
            self.active -= 1

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        if not host_allowed(headers.get("host"), loopback=self.loopback):
            await _plain(send, 421, "this console answers only requests to a loopback address")
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            await _plain(send, 413, f"a request body is at most {MAX_BODY_BYTES} bytes")
            return
        path = scope["path"]
        if not path.startswith(PUBLIC_PREFIXES) and not self.gate.admitted(session_id(scope), self.clock()):
            if scope["method"] in ("GET", "HEAD") and path not in STREAM_PATHS:
                await _redirect(send, "/signin")
            else:
                await _plain(send, 403, "sign in first")
            return
        if path in STREAM_PATHS:
            await self.app(scope, receive, send)
            return
        started = False

        async def noting_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        with anyio.move_on_after(self.timeout_s) as scope_:
            if scope["method"] not in ("GET", "HEAD"):
                body = await _read_body(receive)
                if body is None:
                    await _plain(send, 413, f"a request body is at most {MAX_BODY_BYTES} bytes")
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, noting_send)
        if scope_.cancelled_caught:
            log.warning("console.request_timeout", path=path, timeout_s=self.timeout_s)
            if not started:
                await _plain(send, 503, f"the page took longer than {self.timeout_s:g} s")


#: Headers the guard sets itself (a page's own value of one is replaced).
_OURS = frozenset(name for name, _ in [*SECURITY_HEADERS, NO_STORE])


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None once it passes MAX_BODY_BYTES (a chunked or lying sender)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return bytes(body)  # the client left: what came is what the page gets
        body += message.get("body", b"")
        if len(body) > MAX_BODY_BYTES:
            return None
        if not message.get("more_body", False):
            return bytes(body)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the page the body read already, then what the client does next (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _plain(send: Send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Send, location: str) -> None:
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode()), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})

