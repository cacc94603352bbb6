"""What every backend shares: the key from `api_key_env`, the overall bound, status words, block text, and the
reading of a stream (its text bounded, the loop given its turn).

No SDK imports, so the scripted backend and check-config can use them without
the optional extras installed.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import anyio
import msgspec
import structlog

from mcplhost.agents.backends.answer_bounds import CUT_FINISH, answer_is_empty, cut_answer
from mcplhost.agents.model import BackendError, ModelRequest, ModelResponse, OnText, ToolCall, Usage
from mcplhost.config import BackendConfig
from mcplhost.jsonobject import JsonObject

log = structlog.get_logger()

#: Sent as the key when `api_key_env` is not set: an OpenAI-compatible local server
#: (vLLM, llama.cpp, Ollama) ignores it, a hosted API answers 401 ("auth"). Passing
#: something keeps the SDKs from reading their own variables (OPENAI_API_KEY ...):
#: the key comes only from the variable the config names.
NO_KEY_PLACEHOLDER = "no-key-configured"

#: The SDKs' own retry backoff is capped near 8 s per wait (they honour a shorter
#: Retry-After); the overall bound of one call allows this much per retry.
RETRY_BACKOFF_ALLOWANCE_S = 8.0

#: Text standing in for an image where the target shape takes no pixels (docs/agents.md#compilation).
IMAGE_PLACEHOLDER = "[image]"
#: What one streamed tool call counts for against the answer's bound besides its text (StreamedAnswer): about
#: what its entry costs in memory, so the 4 MiB bound is at most some 16,000 calls.
CALL_CHARS = 256
#: How deep `sdk_error` looks through an exception's causes for a BackendError (the SDKs wrap once or twice).
MAX_CAUSES = 8
#: Reading a stream gives the event loop its turn at least this often (docs/agents.md#bounds): the SDK's event
#: iterator rarely waits while a fast server's bytes are buffered, and would hold the loop for seconds. The turn is
#: a real sleep of STREAM_PAUSE_S, not a bare checkpoint: only a loop that waits lets go of the interpreter, so the
#: store's reader threads run too (a bare checkpoint left `status` round trips six times slower).
STREAM_YIELD_S = 0.005
STREAM_PAUSE_S = 0.001


def api_key(api_key_env: str | None, environ: Mapping[str, str]) -> str | None:
    """The key for a backend: the named variable's value, the placeholder when none is named, None when it is unset."""
    if api_key_env is None:
        return NO_KEY_PLACEHOLDER
    value = environ.get(api_key_env)
    return value if value else None


def missing_key_error(api_key_env: str | None) -> BackendError:
    return BackendError("missing_key", f"environment variable {api_key_env} is not set")


def overall_timeout_s(timeout_s: float, max_retries: int) -> float:
    """One call's whole budget: every attempt's `timeout_s` plus the SDK's backoff between them.

    The SDKs' timeout bounds each read, not an attempt: a server that trickles
    bytes forever would otherwise hold a turn forever.
    """
    return timeout_s * (max_retries + 1) + RETRY_BACKOFF_ALLOWANCE_S * max_retries


def sdk_error(e: Exception, sdk: ModuleType, backend: str) -> BackendError:
    """The BackendError for what an official SDK raised; both SDKs name their errors alike.

    A BackendError among its causes (a bound of backends/http.py, which an SDK may wrap as a connection error)
    is the error.
    """
    cause: BaseException | None = e
    for _ in range(MAX_CAUSES):
        if cause is None:
            break
        if isinstance(cause, BackendError):
            return cause
        cause = cause.__cause__ or cause.__context__
    if isinstance(e, sdk.APITimeoutError):
        return BackendError("timeout", str(e))
    if isinstance(e, sdk.APIConnectionError):
        return BackendError("connection", str(e))
    if isinstance(e, sdk.APIStatusError):
        return BackendError(reason_for_status(e.status_code), f"HTTP {e.status_code}: {e.message}")
    if isinstance(e, (sdk.APIResponseValidationError, ValueError, KeyError, TypeError, AttributeError)):
        return BackendError("malformed", f"{type(e).__name__}: {e}")
    log.warning("backend.unexpected_error", backend=backend, exc_info=True)
    return BackendError("malformed", f"{type(e).__name__}: {e}")


class SdkBackend:
    """What both official-SDK backends share: the key, one client for the backend's life, the bounds, the errors.

    A subclass names its SDK and client class and implements `_call` (one
    request through that client); everything it raises becomes a BackendError.
    The client reads through `bounded_http_client` (backends/http.py). An
    answer with no text and no tool call is never returned (docs/agents.md#bounds):
    a streamed one is asked for again without streaming (a server that answers
    a stream request with plain JSON, or an empty stream), and one still empty
    fails the call with "malformed".
    """

    name = ""

    def __init__(self, config: BackendConfig, *, environ: Mapping[str, str], sdk: ModuleType, client_class: Any) -> None:
        from mcplhost.agents.backends.http import bounded_http_client  # imports the SDKs' HTTP package

        self._sdk = sdk
        self._config = config
        self._overall_s = overall_timeout_s(config.timeout_s, config.max_retries)
        self._warned_empty_stream = False
        key = api_key(config.api_key_env, environ)
        self._client = None if key is None else client_class(
            api_key=key, base_url=config.base_url, timeout=config.timeout_s, max_retries=config.max_retries,
            http_client=bounded_http_client(sdk))

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse:
        if self._client is None:
            raise missing_key_error(self._config.api_key_env)
        if not request.model:
            raise BackendError("bad_request", "no model configured")
        response = await self._bounded_call(request, on_text)
        if answer_is_empty(response) and on_text is not None:
            self._log_empty_stream(response)
            response = await self._bounded_call(request, None)
        if answer_is_empty(response):
            raise BackendError("malformed", f"the answer holds no text and no tool call (finish reason "
                                            f"{response.finish_reason!r})")
        return cut_answer(response, request.max_output_chars)

    async def _bounded_call(self, request: ModelRequest, on_text: OnText | None) -> ModelResponse:
        """One call under the overall bound, every failure a BackendError."""
        try:
            with anyio.fail_after(self._overall_s):
                return await self._call(self._client, request, on_text)
        except TimeoutError:
            raise BackendError("timeout", f"no whole answer within {self._overall_s:g} s") from None
        except Exception as e:  # every SDK failure is a BackendError (model.py)
            raise sdk_error(e, self._sdk, self.name) from e

    def _log_empty_stream(self, response: ModelResponse) -> None:
        """Say once per backend that streamed answers come back empty (a proxy that does not stream), then quietly."""
        fields = {"backend": self.name, "base_url": self._config.base_url, "finish_reason": response.finish_reason}
        if self._warned_empty_stream:
            log.info("backend.empty_stream_read_again", **fields)
            return
        self._warned_empty_stream = True
        log.warning("backend.empty_stream_read_again", **fields,
                    hint="the server answered a stream request with nothing to stream (plain JSON?); each such "
                         "answer is read again without streaming")

    async def _call(self, client: Any, request: ModelRequest, on_text: OnText | None) -> ModelResponse:
        raise NotImplementedError

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()


def reason_for_status(status: int) -> str:
    """BackendError's reason for an HTTP status the SDK gave up on."""
    if status == 429:
        return "rate_limited"
    if status in (401, 403):
        return "auth"
    if status == 408:
        return "timeout"
    if status >= 500:
        return "server_error"
    return "bad_request"


def block_text(blocks: list[dict[str, Any]], *, image: str = IMAGE_PLACEHOLDER) -> str:
    """A block list as one text: text blocks joined by newlines, images as `[image]`, other blocks skipped."""
    parts: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "image":
            parts.append(image)
    return "\n".join(parts)


def estimated_tokens(chars: int) -> int:
    """A rough, deterministic token count (4 characters a token) for backends that do not report usage."""
    return math.ceil(chars / 4)


def tool_arguments(raw: str | None, tool: str) -> JsonObject:
    """A tool call's arguments from their JSON text ("" is no arguments); anything but a JSON object is malformed."""
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        raise BackendError("malformed", f"arguments of tool call {tool!r} are not JSON") from None
    if not isinstance(value, dict):
        raise BackendError("malformed", f"arguments of tool call {tool!r} are not a JSON object")
    return value


class StreamedAnswer:
    """A streamed answer gathered as its events come, in bounded memory, whatever the SDK's event shapes.

    `text(piece)` hands `on_text` each piece up to `max_chars` of text and
    says False once the text passed it: the reader stops there (nothing after
    is read, docs/agents.md#bounds). Tool calls are gathered by index from
    their pieces, at most `max_arguments` characters in all (backends/http.py
    bounds one event; this bounds their sum), each call counting
    `CALL_CHARS` besides its id, name and arguments, so a stream of empty
    calls cannot grow the table of calls without bound either.
    """

    def __init__(self, on_text: OnText, max_chars: int, *, max_arguments: int) -> None:
        self._on_text = on_text
        self._left = max_chars
        self._max_arguments = max_arguments
        self._arguments = 0
        self.cut = False
        self.parts: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}

    def text(self, piece: str) -> bool:
        if len(piece) > self._left:
            piece, self.cut = piece[: self._left], True
        if piece:
            self._left -= len(piece)
            self.parts.append(piece)
            self._on_text(piece)
        return not self.cut

    def tool_piece(self, index: int, *, call_id: str | None = None, name: str | None = None,
                   arguments: str | None = None) -> None:
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = {"id": "", "name": "", "arguments": []}
            self._arguments += CALL_CHARS
        self._arguments += len(call_id or "") + len(name or "") + len(arguments or "")
        if self._arguments > self._max_arguments:
            raise BackendError("too_large", f"the answer's tool calls passed {self._max_arguments} characters")
        if call_id:
            call["id"] = call_id
        if name:
            call["name"] += name
        if arguments:
            call["arguments"].append(arguments)

    def tool_calls(self) -> list[ToolCall]:
        """The gathered calls in index order; none when the text was cut (the answer ended there)."""
        if self.cut:
            return []
        return [ToolCall(id=c["id"], name=c["name"], arguments=tool_arguments("".join(c["arguments"]), c["name"]))
                for _, c in sorted(self.calls.items())]

    def response(self, *, finish_reason: str, usage: Usage, model: str) -> ModelResponse:
        """The answer; a cut one ends with `CUT_FINISH` and no tool call (agents/backends/answer_bounds.py `cut_answer`).

        A stream left before its end never got its usage (it comes last): its output counts at least the
        estimated tokens of the text read, so `max_tokens_per_day` still sees it.
        """
        text = "".join(self.parts)
        if self.cut:
            usage = msgspec.structs.replace(usage, output_tokens=max(usage.output_tokens, estimated_tokens(len(text))))
        return ModelResponse(text=text, tool_calls=self.tool_calls(),
                             finish_reason=CUT_FINISH if self.cut else finish_reason, usage=usage, model=model)


class LoopTurns:
    """Gives the event loop (and the other threads) a `STREAM_PAUSE_S` turn at least every `STREAM_YIELD_S` while a
    stream's events are read; `tick` after each event."""

    def __init__(self) -> None:
        self._due = time.perf_counter() + STREAM_YIELD_S

    async def tick(self) -> None:
        if time.perf_counter() >= self._due:
            await anyio.sleep(STREAM_PAUSE_S)
            self._due = time.perf_counter() + STREAM_YIELD_S
