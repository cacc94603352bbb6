"""The `anthropic` backend: the Messages API via the official SDK (docs/agents.md#backends).

One `complete` is one Messages call: streamed (`stream=True`, its raw events)
when the caller listens (`on_text` gets each text delta, up to
`max_output_chars`), whole otherwise; a streamed answer that came back empty
is asked for once more, unstreamed (backends/common.py `SdkBackend`). Retries are the
SDK's (`max_retries`), `timeout_s` per attempt, one overall bound over all
attempts; every failure becomes `BackendError`.

Shapes: the system prompt is a text block marked `cache_control`, and so is
the last block of the stable prefix (`ModelRequest.stable_prefix` leading
messages), so the unchanged head of the context is read from the prompt cache;
`Usage.cached_tokens` is the cache read, `input_tokens` all input (uncached,
cache writes and reads). Consecutive messages of one role are merged (tool
results are user content here); images are base64 image sources; a tool
result carries its text and images. `temperature`, which this SDK no longer
names, goes in the body as given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcplhost.agents.backends.common import LoopTurns, SdkBackend, StreamedAnswer
from mcplhost.agents.backends.http import RESPONSE_MAX_BYTES
from mcplhost.agents.model import (
    BackendError,
    Message,
    ModelRequest,
    ModelResponse,
    OnText,
    ToolCall,
    Usage,
)
from mcplhost.config import BackendConfig
from mcplhost.jsonobject import JsonObject

__all__ = ["AnthropicBackend", "request_kwargs"]

CACHE_CONTROL = {"type": "ephemeral"}
#: Opens the context when dropping old rows left an assistant message first (the API wants a user turn first).
CONTEXT_OPENING = "[host] earlier context omitted"
_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


# --- request shapes (pure) ---------------------------------------------------


def _content_blocks(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in blocks:
        if block.get("type") == "text" and block.get("text"):  # the API refuses empty text blocks
            out.append({"type": "text", "text": block["text"]})
        elif block.get("type") == "image":
            source = {"type": "base64", "media_type": block.get("mimeType", "image/png"), "data": block.get("data", "")}
            out.append({"type": "image", "source": source})
    return out


def _message(message: Message) -> JsonObject:
    if message.role == "tool":
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id or "", "content": []}
        result["content"] = _content_blocks(message.content)
        return {"role": "user", "content": [result]}
    content = _content_blocks(message.content)
    if message.role == "assistant":
        content = [b for b in content if b["type"] == "text"]  # an assistant turn holds no images
        content.extend(
            {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in message.tool_calls
        )
    return {"role": message.role, "content": content}


def _messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The Messages list: merged by role, the stable prefix's last block marked for the cache."""
    merged: list[dict[str, Any]] = []
    for i, message in enumerate(request.messages):
        shaped = _message(message)
        in_prefix = i < request.stable_prefix
        if merged and merged[-1]["role"] == shaped["role"] and merged[-1]["in_prefix"] == in_prefix:
            merged[-1]["content"].extend(shaped["content"])
        else:
            merged.append({**shaped, "in_prefix": in_prefix})
    merged = [m for m in merged if m["content"]]
    if merged and merged[0]["role"] != "user":
        opening = [{"type": "text", "text": CONTEXT_OPENING}]
        merged.insert(0, {"role": "user", "content": opening, "in_prefix": merged[0]["in_prefix"]})
    prefix = [m for m in merged if m["in_prefix"]]
    if prefix:
        last = prefix[-1]["content"]
        last[-1] = {**last[-1], "cache_control": CACHE_CONTROL}
    return [{"role": m["role"], "content": m["content"]} for m in merged]


def request_kwargs(request: ModelRequest) -> JsonObject:
    """The `messages.create` arguments for a request (streamed or not)."""
    kwargs: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": _messages(request),
    }
    if request.system:
        kwargs["system"] = [{"type": "text", "text": request.system, "cache_control": CACHE_CONTROL}]
    if request.tools:
        kwargs["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in request.tools
        ]
    if request.temperature is not None:
        kwargs["extra_body"] = {"temperature": request.temperature}
    return kwargs


# --- answer shapes (pure) ----------------------------------------------------


#: The SDK's usage fields this backend reads; a stream's `message_delta` repeats the ones it updates (cumulative).
_USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    return _usage_of({name: getattr(usage, name, None) or 0 for name in _USAGE_FIELDS})


def _usage_of(counts: dict[str, int]) -> Usage:
    read = counts["cache_read_input_tokens"]
    return Usage(
        input_tokens=counts["input_tokens"] + read + counts["cache_creation_input_tokens"],
        output_tokens=counts["output_tokens"],
        cached_tokens=read,
    )


def _stop_reason(reason: str | None, tool_calls: list[ToolCall]) -> str:
    if reason:
        return _STOP_REASONS.get(reason, reason)
    return "tool_calls" if tool_calls else "stop"


def response_from_message(message: Any) -> ModelResponse:
    """A whole (non-streamed) Message as a ModelResponse."""
    if isinstance(message, str):  # the SDK's reading of a body that is not JSON (a proxy's HTML page)
        raise BackendError("malformed", "the answer is not JSON")
    text: list[str] = []
    tool_calls: list[ToolCall] = []
    for block in message.content or []:
        if block.type == "text":
            text.append(block.text)
        elif block.type == "tool_use":
            if not isinstance(block.input, dict):
                raise BackendError("malformed", f"input of tool call {block.name!r} is not a JSON object")
            tool_calls.append(ToolCall(id=block.id, name=block.name, arguments=dict(block.input)))
    return ModelResponse(
        text="".join(text),
        tool_calls=tool_calls,
        finish_reason=_stop_reason(message.stop_reason, tool_calls),
        usage=_usage(message.usage),
        model=message.model or "",
    )


class _StreamState:
    """What a stream's events say besides text and tool calls: the model, the stop reason, the usage so far."""

    def __init__(self) -> None:
        self.model = ""
        self.stop_reason: str | None = None
        self.counts = dict.fromkeys(_USAGE_FIELDS, 0)

    def count(self, usage: Any) -> None:
        for name in _USAGE_FIELDS:
            value = getattr(usage, name, None)
            if value is not None:
                self.counts[name] = value


def _read_event(streamed: StreamedAnswer, state: _StreamState, event: Any) -> bool:
    """One raw stream event into `streamed` and `state`; False once the text passed the bound (read no further)."""
    kind = event.type
    if kind == "content_block_delta":
        delta = event.delta
        if delta.type == "text_delta":
            return streamed.text(delta.text)
        if delta.type == "input_json_delta":
            streamed.tool_piece(event.index, arguments=delta.partial_json)
    elif kind == "content_block_start":
        block = event.content_block
        if block.type == "tool_use":
            streamed.tool_piece(event.index, call_id=block.id, name=block.name)
        elif block.type == "text" and block.text:
            return streamed.text(block.text)
    elif kind == "message_start":
        state.model = event.message.model or state.model
        state.count(event.message.usage)
    elif kind == "message_delta":
        state.stop_reason = event.delta.stop_reason or state.stop_reason
        state.count(event.usage)
    return True


# --- the backend (I/O) -------------------------------------------------------


class AnthropicBackend(SdkBackend):
    """Messages through `anthropic.AsyncAnthropic`, one client for the backend's life."""

    name = "anthropic"

    def __init__(self, config: BackendConfig, *, environ: Mapping[str, str]) -> None:
        import anthropic  # optional extra; make_backend checked it is importable

        super().__init__(config, environ=environ, sdk=anthropic, client_class=anthropic.AsyncAnthropic)

    async def _call(self, client: Any, request: ModelRequest, on_text: OnText | None) -> ModelResponse:
        if on_text is None:
            return response_from_message(await client.messages.create(**request_kwargs(request)))
        # The raw events, not the SDK's `messages.stream` helper: that one keeps the whole answer (a text grown by
        # `+=` and each tool input re-parsed from its start on every delta), which a long answer makes quadratic.
        streamed = StreamedAnswer(on_text, request.max_output_chars, max_arguments=RESPONSE_MAX_BYTES)
        state = _StreamState()
        turns = LoopTurns()
        stream = await client.messages.create(**request_kwargs(request), stream=True)
        async with stream:
            async for event in stream:
                if not _read_event(streamed, state, event):
                    break
                await turns.tick()
        tool_calls = streamed.tool_calls()
        return streamed.response(finish_reason=_stop_reason(state.stop_reason, tool_calls),
                                 usage=_usage_of(state.counts), model=state.model)
