"""A real local HTTP server speaking OpenAI Chat Completions and Anthropic Messages, for tests.

`LlmServer` listens on 127.0.0.1 (a free port) in a thread, so both an SDK in
the test's own event loop and a host subprocess can reach it. It answers
`POST /v1/chat/completions` and `POST /v1/messages` in each API's shape, as
one JSON body or as SSE when the request says `"stream": true`. Replies are
queued with `push` and used in order by any endpoint; when the queue is empty
the `default` reply answers. A reply is text (where `{{last_user}}` stands for
the last user message's text and `{{key}}` for the api key the request
carried, as a proxy echoing its headers would), tool calls, an HTTP error status (429 and 500
carry a short `retry-after-ms`, so the SDKs retry at once), a hang that never
answers (until the server closes), a stream that trickles comments forever,
or a malformed body. Misbehaviours of real servers and proxies: a stream
request answered with the plain JSON answer (`stream_as_json`), a stream cut
after its first events (`cut_after`), a body of another kind (`raw`, e.g. an
HTML page), a gzip body (`gzip`), a body without content-length
(`declared=False`), and an answer of `huge` characters made as
it is sent (never held whole), streamed in `chunk_chars` deltas or as one
event (`one_event`). Every request is recorded (path, headers, JSON body)
before it is answered, and the bytes of each answer's body that went out
(`written`, in the order the answers ended; a client that stops reading
stops it).

`POST /v1/moderations` answers in the OpenAI shape without touching the
reply queue: an input holding one of `flag_words` is flagged (category
`harassment`), any other is not; `moderation_status` other than 200 answers
that HTTP error instead.

Run on its own (`python -m tests.agents.llm_server`) it prints its base URL and
answers with the default reply until interrupted.
"""

from __future__ import annotations

import json
import sys
import threading
import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import chain, islice
from typing import Any

__all__ = ["LlmServer", "Recorded", "Reply", "ToolUse"]

#: A hanging reply waits at most this long (or until the server closes) before giving up its thread.
HANG_MAX_S = 60.0
#: A trickling stream sends a comment this often.
TRICKLE_EVERY_S = 0.05
#: Streamed text comes in deltas of this many characters, so a client sees more than one.
STREAM_CHUNK_CHARS = 4
#: Stands for a huge reply's text in a body or an event, replaced by its characters as they are written.
HUGE_MARK = "@@huge@@"
HUGE_PIECE_CHARS = 1 << 16
#: A stream's events are written in batches of about this many bytes (one write per event is slow for long ones).
WRITE_BATCH_BYTES = 1 << 16
#: What 429 and 500 replies tell the SDKs to wait before retrying (milliseconds).
RETRY_AFTER_MS = "5"
LAST_USER = "{{last_user}}"
KEY = "{{key}}"
#: The categories a moderations answer lists (a subset of OpenAI's).
MODERATION_CATEGORIES = ("harassment", "hate", "self-harm", "sexual", "violence")
MODERATIONS_PATH = "/v1/moderations"
#: How often the serving thread looks for a shutdown request (the stdlib default, 0.5 s, slows every test's teardown).
SHUTDOWN_POLL_S = 0.02


@dataclass(frozen=True)
class ToolUse:
    """A tool call the fake model makes."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """One answer of the fake model, or one way of failing."""

    text: str = "ok"
    tool_calls: tuple[ToolUse, ...] = ()
    status: int = 200
    hang: bool = False
    trickle: bool = False  # streamed: the first event, then SSE comments forever, so no read ever times out
    malformed: bool = False
    stream_as_json: bool = False  # a stream request gets the plain JSON answer (many proxies do this)
    cut_after: int | None = None  # streamed: only the first N events, then the connection closes
    raw: tuple[str, bytes] | None = None  # status 200 with this content type and body, whatever was asked
    gzip: bool = False  # not streamed: the JSON body gzip-compressed (content-encoding: gzip)
    declared: bool = True  # not streamed: with content-length (False: none, the body ends when the connection closes)
    huge: int = 0  # the text is this many "x" characters, made as they are sent
    chunk_chars: int = STREAM_CHUNK_CHARS  # streamed text comes in deltas of this many characters
    one_event: bool = False  # streamed: the whole text in one delta event (one line)
    input_tokens: int = 11
    output_tokens: int = 7
    cached_tokens: int = 0

    @classmethod
    def error(cls, status: int) -> Reply:
        return cls(status=status)


@dataclass(frozen=True)
class Recorded:
    """One request as the server received it."""

    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or None when the body was not JSON


def _last_user_text(api: str, body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages", [])):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [p.get("text", "") for p in content or [] if p.get("type") == "text"]
        if api == "anthropic" and not texts:
            continue  # a user turn holding only tool results
        return "\n".join(texts)
    return ""


def _request_key(headers: dict[str, str]) -> str:
    """The api key a request carried: OpenAI's bearer token, or Anthropic's x-api-key."""
    bearer = headers.get("authorization", "")
    return bearer.removeprefix("Bearer ") if bearer else headers.get("x-api-key", "")


def _pieces(text: str, size: int = STREAM_CHUNK_CHARS) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _text_pieces(reply: Reply, text: str) -> Iterator[str]:
    """The deltas a streamed answer's text comes in; a huge text's are made one at a time."""
    if reply.one_event:
        yield HUGE_MARK if reply.huge else text  # one event: a huge one is expanded as it is written
    elif reply.huge:
        full, left = divmod(reply.huge, reply.chunk_chars)
        piece = "x" * reply.chunk_chars
        for _ in range(full):
            yield piece
        if left:
            yield "x" * left
    else:
        yield from _pieces(text, reply.chunk_chars)


def _expand(parts: Iterable[str], huge: int) -> Iterator[str]:
    """`parts` with the huge mark replaced by `huge` "x" characters, made in pieces (never held whole)."""
    for part in parts:
        if HUGE_MARK not in part:
            yield part
            continue
        head, tail = part.split(HUGE_MARK, 1)
        yield head
        for start in range(0, huge, HUGE_PIECE_CHARS):
            yield "x" * min(HUGE_PIECE_CHARS, huge - start)
        yield tail


# --- OpenAI Chat Completions shapes ------------------------------------------


def _openai_usage(reply: Reply) -> dict[str, Any]:
    return {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
        "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
    }


def _openai_json(reply: Reply, text: str, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": json.dumps(t.arguments)}}
            for t in reply.tool_calls
        ]
    finish = "tool_calls" if reply.tool_calls else "stop"
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": _openai_usage(reply),
    }


def _openai_events(reply: Reply, text: str, model: str) -> Iterator[str]:
    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
        body = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": model}
        return f"data: {json.dumps({**body, 'choices': choices, **extra})}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    for piece in _text_pieces(reply, text):
        yield chunk({"content": piece})
    for index, t in enumerate(reply.tool_calls):
        start = {"index": index, "id": t.id, "type": "function", "function": {"name": t.name, "arguments": ""}}
        yield chunk({"tool_calls": [start]})
        for piece in _pieces(json.dumps(t.arguments)):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, "tool_calls" if reply.tool_calls else "stop")
    usage = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": model}
    yield f"data: {json.dumps({**usage, 'choices': [], 'usage': _openai_usage(reply)})}\n\n"
    yield "data: [DONE]\n\n"


def _moderation_json(text: str, flag_words: set[str], model: str) -> dict[str, Any]:
    """An OpenAI moderations answer: one result, flagged (as harassment) when `text` holds a flag word."""
    flagged = any(word in text for word in flag_words)
    categories = {name: flagged and name == "harassment" for name in MODERATION_CATEGORIES}
    scores = {name: 0.99 if hit else 0.01 for name, hit in categories.items()}
    return {"id": "modr-test", "model": model,
            "results": [{"flagged": flagged, "categories": categories, "category_scores": scores}]}


# --- Anthropic Messages shapes -----------------------------------------------


def _anthropic_usage(reply: Reply) -> dict[str, Any]:
    return {
        "input_tokens": reply.input_tokens,
        "output_tokens": reply.output_tokens,
        "cache_read_input_tokens": reply.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def _anthropic_json(reply: Reply, text: str, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": t.id, "name": t.name, "input": t.arguments} for t in reply.tool_calls]
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": _anthropic_usage(reply),
    }


def _anthropic_events(reply: Reply, text: str, model: str) -> Iterator[str]:
    def event(name: str, data: dict[str, Any]) -> str:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n"

    start = {**_anthropic_json(reply, "", model), "content": [], "stop_reason": None}
    start["usage"] = {**_anthropic_usage(reply), "output_tokens": 1}
    yield event("message_start", {"type": "message_start", "message": start})
    index = 0
    if text or reply.huge:
        block = {"type": "text", "text": ""}
        yield event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
        for piece in _text_pieces(reply, text):
            delta = {"type": "text_delta", "text": piece}
            yield event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield event("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    for t in reply.tool_calls:
        block = {"type": "tool_use", "id": t.id, "name": t.name, "input": {}}
        yield event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
        for piece in _pieces(json.dumps(t.arguments)):
            delta = {"type": "input_json_delta", "partial_json": piece}
            yield event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield event("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    stop = {"stop_reason": "tool_use" if reply.tool_calls else "end_turn", "stop_sequence": None}
    yield event("message_delta", {"type": "message_delta", "delta": stop, "usage": _anthropic_usage(reply)})
    yield event("message_stop", {"type": "message_stop"})


def _error_body(api: str, status: int) -> dict[str, Any]:
    kind = {429: "rate_limit_error", 401: "authentication_error", 400: "invalid_request_error"}.get(status, "api_error")
    if api == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": f"test server says {status}"}}
    return {"error": {"message": f"test server says {status}", "type": kind, "code": None}}


# --- the server ----------------------------------------------------------------


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up mid-answer (a timeout, a malformed stream) is expected; anything else is printed."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class LlmServer:
    """The fake model endpoint; use as a context manager (`with LlmServer() as server:`)."""

    def __init__(self, default: Reply | None = None) -> None:
        self.default = default or Reply()
        self.flag_words: set[str] = set()  # POST /v1/moderations flags an input holding one
        self.moderation_status = 200  # POST /v1/moderations answers this error status when not 200
        self._replies: deque[Reply] = deque()
        self._recorded: list[Recorded] = []
        self._written: list[int] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = _QuietServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, name="llm-server", daemon=True
        )

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push(self, *replies: Reply) -> None:
        """Queue replies, answered in order by whichever requests come next."""
        with self._lock:
            self._replies.extend(replies)

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._recorded)

    def take(self, recorded: Recorded) -> Reply:
        """Record a request as it arrived; the next queued reply (the default once none is queued)."""
        with self._lock:
            self._recorded.append(recorded)
            return self._replies.popleft() if self._replies else self.default

    @property
    def written(self) -> list[int]:
        """The body bytes each finished answer sent (a client that stopped reading stopped it early)."""
        with self._lock:
            return list(self._written)

    def wrote(self, count: int) -> None:
        with self._lock:
            self._written.append(count)

    def record(self, recorded: Recorded) -> None:
        """Record a request that takes no reply from the queue (a moderation)."""
        with self._lock:
            self._recorded.append(recorded)

    def start(self) -> LlmServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()  # releases hanging replies
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> LlmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_hang(self) -> None:
        self._closing.wait(HANG_MAX_S)

    def wait_closing(self, seconds: float) -> bool:
        return self._closing.wait(seconds)


def _handler_for(server: LlmServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            return None

        def do_POST(self) -> None:  # noqa: N802 - the base class's name
            self._sent = 0  # body bytes of this answer written so far (`_write`)
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            headers = {k.lower(): v for k, v in self.headers.items()}
            if self.path == MODERATIONS_PATH:
                self._moderate(Recorded(path=self.path, headers=headers, body=body))
                return
            reply = server.take(Recorded(path=self.path, headers=headers, body=body))
            api = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic"}.get(self.path)
            if api is None or not isinstance(body, dict):
                self._send(404 if api is None else 400, {"error": {"message": "unknown path or body"}})
                return
            if reply.hang:
                server.wait_hang()
                self.close_connection = True
                return
            if reply.status != 200:
                self._send(reply.status, _error_body(api, reply.status), {"retry-after-ms": RETRY_AFTER_MS})
                return
            text = HUGE_MARK if reply.huge else \
                reply.text.replace(LAST_USER, _last_user_text(api, body)).replace(KEY, _request_key(headers))
            model = str(body.get("model", ""))
            try:
                self._answer(api, reply, text, model, stream=bool(body.get("stream")))
            finally:
                server.wrote(self._sent)

        def _answer(self, api: str, reply: Reply, text: str, model: str, *, stream: bool) -> None:
            if reply.raw is not None:
                kind, data = reply.raw
                self._send_raw(200, data, kind)
            elif stream and not reply.stream_as_json:
                events: Iterable[str] = (_openai_events if api == "openai" else _anthropic_events)(reply, text, model)
                if reply.malformed:
                    broken = "data: {not json\n\n" if api == "openai" else "event: content_block_delta\ndata: {not\n\n"
                    events = chain(islice(events, 1), [broken], events)
                if reply.trickle:
                    events = islice(events, 1)
                elif reply.cut_after is not None:
                    events = islice(events, reply.cut_after)
                self._stream(_expand(events, reply.huge))
                while reply.trickle and not server.wait_closing(TRICKLE_EVERY_S):
                    self._write(b": still thinking\n\n")
                    self.wfile.flush()
            elif reply.malformed:
                self._send_raw(200, b'{"id": "broken", "choices": [', "application/json")
            else:
                answer = json.dumps((_openai_json if api == "openai" else _anthropic_json)(reply, text, model))
                parts = _expand([answer], reply.huge)
                if reply.gzip:
                    packer = zlib.compressobj(wbits=31)  # the gzip format
                    data = b"".join(packer.compress(part.encode()) for part in parts) + packer.flush()
                    self._send_raw(200, data, "application/json", {"content-encoding": "gzip"})
                    return
                length = len(answer.encode()) + (reply.huge - len(HUGE_MARK) if reply.huge else 0)
                self._head(200, "application/json", length if reply.declared else None)
                for part in parts:
                    self._write(part.encode())

        def _moderate(self, recorded: Recorded) -> None:
            server.record(recorded)
            body = recorded.body
            if server.moderation_status != 200:
                self._send(server.moderation_status, _error_body("openai", server.moderation_status),
                           {"retry-after-ms": RETRY_AFTER_MS})
            elif not isinstance(body, dict) or not isinstance(body.get("input"), str):
                self._send(400, _error_body("openai", 400))
            else:
                self._send(200, _moderation_json(body["input"], server.flag_words, str(body.get("model", ""))))

        def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            self._send_raw(status, json.dumps(body).encode(), "application/json", headers)

        def _send_raw(self, status: int, data: bytes, kind: str, headers: dict[str, str] | None = None) -> None:
            self._head(status, kind, len(data), headers)
            self._write(data)

        def _head(self, status: int, kind: str, length: int | None, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            if length is None:
                self.send_header("connection", "close")
                self.close_connection = True
            else:
                self.send_header("content-length", str(length))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()

        def _write(self, data: bytes) -> None:
            self.wfile.write(data)
            self._sent += len(data)

        def _stream(self, events: Iterable[str]) -> None:
            """Send `events` as SSE, in batches of about WRITE_BATCH_BYTES (the last flushed as it is)."""
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            batch: list[bytes] = []
            size = 0
            for event in events:
                data = event.encode()
                batch.append(data)
                size += len(data)
                if size >= WRITE_BATCH_BYTES:
                    self._write(b"".join(batch))
                    self.wfile.flush()
                    batch, size = [], 0
            self._write(b"".join(batch))
            self.wfile.flush()

    return Handler


def main() -> None:
    server = LlmServer(Reply(text="echo: {{last_user}}")).start()
    print(f"openai base_url {server.openai_base_url}  anthropic base_url {server.anthropic_base_url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.close()


if __name__ == "__main__":
    main()
