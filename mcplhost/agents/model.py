"""What a turn hands a model backend and what it gets back: plain data, the same for every backend.

The context compiler (turns/compiler.py) builds a `ModelRequest`; a `Backend`
(backends/) turns it into one SDK call and its answer into a
`ModelResponse`. The turn runner (turns/runner.py) never sees an SDK type, so a
scripted backend and a real one are interchangeable, and the request digest
is computed over this shape, not over an SDK's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

import msgspec

from mcplhost.config import DEFAULT_MAX_OUTPUT_CHARS


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A tool offered to the model: a host tool, or a connector's MCP tool as `<connector>__<tool>`."""

    name: str
    description: str
    input_schema: dict[str, Any]  # JSON Schema of the arguments object


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One call the model asked for; `id` pairs it with its result."""

    id: str
    name: str
    arguments: dict[str, Any]


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """One message of the conversation sent to the model.

    `content` is a list of blocks: `{"type": "text", "text": ...}` or
    `{"type": "image", "data": <base64>, "mimeType": ...}` (MCP's shape).
    A `tool` message answers `tool_call_id`; an `assistant` message may carry
    `tool_calls` (with or without text before them).
    """

    role: Literal["user", "assistant", "tool"]
    content: list[dict[str, Any]]
    tool_calls: list[ToolCall] = []
    tool_call_id: str | None = None


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one backend call needs; deterministic for the same stored rows and config."""

    model: str
    system: str
    messages: list[Message]
    tools: list[ToolSpec] = []
    max_tokens: int = 1024
    temperature: float | None = None
    #: How many leading messages form the stable prefix (unchanged across the turns that follow),
    #: which the Anthropic backend marks with cache_control.
    stable_prefix: int = 0
    #: The waking items' text without source headers (hooks' userMessage); None outside a turn. Never sent
    #: to a model (the messages hold it) and not in the request digest: the scripted backend's `{{echo}}`.
    waking_text: str | None = None
    #: The answer's text is cut here (the agent's `max_output_chars`, docs/agents.md#bounds): a stream is read no
    #: further. Never sent to a model; the turn sets it after taking the request digest (which sees the default).
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0


class ModelResponse(msgspec.Struct, frozen=True, kw_only=True):
    """The model's answer: prose, the tool calls it asks for, why it stopped, and what it cost."""

    text: str
    tool_calls: list[ToolCall] = []
    finish_reason: str = "stop"  # "stop" | "tool_calls" | "length" | the backend's own word
    usage: Usage = Usage()
    model: str = ""


class BackendError(Exception):
    """A backend call failed after the SDK's own retries; the turn fails with `reason`.

    reason: "timeout", "rate_limited", "server_error", "malformed" (an answer not in the API's shape, or one
    with no text and no tool call), "too_large" (an answer's body past the HTTP bound), "connection", "auth",
    "bad_request", "missing_key", "unavailable" (SDK not installed).
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


#: Called with each piece of streamed text as it arrives (speech streaming uses it later).
OnText = Callable[[str], None]


class Backend(Protocol):
    """One model: `complete` makes one call (streamed or not) and returns the whole answer."""

    name: str  # "scripted" | "openai" | "anthropic"

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse: ...

    async def aclose(self) -> None: ...
