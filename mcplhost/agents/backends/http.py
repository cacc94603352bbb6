"""The HTTP client both official SDKs read through: an answer's body is bounded as it arrives (docs/agents.md#bounds).

    client_class(..., http_client=bounded_http_client(sdk))

The SDKs take an `httpx2.AsyncClient` (`http_client=`); each one's
`DefaultAsyncHttpxClient` keeps the SDK's own connection limits, proxies from
the environment and redirects, and takes `event_hooks`. The response hook
runs when the headers are in, before any of the body is read, and swaps the
response's byte stream for `BoundedBody`, which counts what it hands on:

- a body (JSON) longer than `RESPONSE_MAX_BYTES` (4 MiB) fails the call with
  `BackendError("too_large")` as soon as it passes the bound (a declared
  `content-length` past it, before reading a byte), so an answer is never
  held whole past it;
- an event stream may run as long as its text is wanted (the backend stops
  reading at `max_output_chars`), but one line of it (one event) longer than
  `EVENT_LINE_MAX_BYTES` (4 MiB) fails the same way: the SDK's event
  decoder holds a line whole.

Why 4 MiB: an answer of the default bounds (100,000 characters, even all
escaped, and 16 tool calls) is well under 1 MiB, while the SDK's objects for
a body of tiny tool calls weigh some 25 times the body (4 MiB of them: about
100 MB at the peak; 16 MiB: 360 MB). An agent that raises `max_output_chars`
past about a million characters streams its answers (a stream's length is
bounded by its text, not by this).

The client asks for `Accept-Encoding: identity` and refuses a compressed
answer (`malformed`): a few KiB of gzip can inflate to gigabytes, and the
bound counts the bytes that arrive.

Every refusal is raised when the body is read, never from the hook, and
marks the response `x-should-retry: false` first: an SDK that wraps the
failure as a connection error decides whether to retry from that header,
which it can read only once the hook has handed it the response. So a
refused answer is not fetched again, and the backend finds the
`BackendError` among the SDK error's causes (backends/common.py `sdk_error`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import ModuleType
from typing import cast

import httpx2

from mcplhost.agents.model import BackendError

__all__ = ["EVENT_LINE_MAX_BYTES", "RESPONSE_MAX_BYTES", "BoundedBody", "bounded_http_client"]

RESPONSE_MAX_BYTES = 4 * 2**20
EVENT_LINE_MAX_BYTES = 4 * 2**20
EVENT_STREAM = "text/event-stream"
IDENTITY = "identity"


#: The response header both SDKs read before retrying a failed attempt.
NO_RETRY = ("x-should-retry", "false")


class BoundedBody(httpx2.AsyncByteStream):
    """A response's bytes, handed on as they come; past `max_bytes` in all (None: no bound) or past
    `max_line_bytes` without a newline, `BackendError("too_large")`. With `refusal`, that error before any byte."""

    def __init__(self, response: httpx2.Response, *, max_bytes: int | None, max_line_bytes: int,
                 refusal: BackendError | None = None) -> None:
        self._response = response
        # httpx types one Response for both its clients; an AsyncClient's (the SDKs') streams asynchronously.
        self._inner = cast(httpx2.AsyncByteStream, response.stream)
        self._max_bytes = max_bytes
        self._max_line_bytes = max_line_bytes
        self._refusal = refusal
        self._total = 0
        self._line = 0  # bytes since the last newline

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._refusal is not None:
            self._refuse(self._refusal)
        async for chunk in self._inner:
            self._count(chunk)
            yield chunk

    def _count(self, chunk: bytes) -> None:
        self._total += len(chunk)
        if self._max_bytes is not None and self._total > self._max_bytes:
            self._refuse(BackendError("too_large", f"the answer's body passed {self._max_bytes} bytes"))
        # A line wholly inside one chunk is no longer than the chunk (one read of the transport, 64 KiB): only the
        # line running on from earlier chunks is counted.
        newline = chunk.rfind(b"\n")
        if newline < 0:
            self._line += len(chunk)
        elif self._line + chunk.find(b"\n") > self._max_line_bytes:
            self._line += chunk.find(b"\n")
        else:
            self._line = len(chunk) - newline - 1
        if self._line > self._max_line_bytes:
            self._refuse(BackendError("too_large", f"one line of the answer passed {self._max_line_bytes} bytes"))

    def _refuse(self, error: BackendError) -> None:
        self._response.headers[NO_RETRY[0]] = NO_RETRY[1]
        raise error

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _bound_response(response: httpx2.Response) -> None:
    """The response hook: the body is read through `BoundedBody`, refused at once when compressed or declared
    too long."""
    refusal = None
    encoding = response.headers.get("content-encoding", IDENTITY).strip().lower()
    streamed = response.headers.get("content-type", "").split(";")[0].strip().lower() == EVENT_STREAM
    declared = response.headers.get("content-length", "")
    if encoding not in ("", IDENTITY):
        refusal = BackendError("malformed", f"the answer is {encoding}-encoded though the request asked for identity")
    elif not streamed and declared.isdigit() and int(declared) > RESPONSE_MAX_BYTES:
        refusal = BackendError("too_large", f"the answer's body is {declared} bytes, past {RESPONSE_MAX_BYTES}")
    response.stream = BoundedBody(response, max_bytes=None if streamed else RESPONSE_MAX_BYTES,
                                  max_line_bytes=EVENT_LINE_MAX_BYTES, refusal=refusal)


def bounded_http_client(sdk: ModuleType) -> httpx2.AsyncClient:
    """An SDK's default async HTTP client with the body bound and identity encoding (the module docstring)."""
    client: httpx2.AsyncClient = sdk.DefaultAsyncHttpxClient(
        headers={"Accept-Encoding": IDENTITY}, event_hooks={"response": [_bound_response]})
    return client
