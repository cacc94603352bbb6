"""The `anthropic` backend: the Messages API via the official SDK (docs/agents.md#backends).

One `complete` is one Messages call: `messages.stream` when the caller listens
(`on_text` gets each text delta), `messages.create` otherwise. Retries are the
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

from mcplhost.agents.backends.common import SdkBackend
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


def _message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        result = {"type": "tool_result", "tool_use_id": message.tool_call_id or "", "content": []}
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


def request_kwargs(request: ModelRequest) -> dict[str, Any]:
    """The `messages.create` / `messages.stream` arguments for a request."""
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


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    read = usage.cache_read_input_tokens or 0
    written = usage.cache_creation_input_tokens or 0
    return Usage(
        input_tokens=(usage.input_tokens or 0) + read + written,
        output_tokens=usage.output_tokens or 0,
        cached_tokens=read,
    )


def response_from_message(message: Any) -> ModelResponse:
    """A whole Message (streamed and accumulated, or not) as a ModelResponse."""
    text: list[str] = []
    tool_calls: list[ToolCall] = []
    for block in message.content or []:
        if block.type == "text":
            text.append(block.text)
        elif block.type == "tool_use":
            if not isinstance(block.input, dict):
                raise BackendError("malformed", f"input of tool call {block.name!r} is not a JSON object")
            tool_calls.append(ToolCall(id=block.id, name=block.name, arguments=dict(block.input)))
    reason = message.stop_reason
    return ModelResponse(
        text="".join(text),
        tool_calls=tool_calls,
        finish_reason=_STOP_REASONS.get(reason, reason) if reason else ("tool_calls" if tool_calls else "stop"),
        usage=_usage(message.usage),
        model=message.model or "",
    )


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
        async with client.messages.stream(**request_kwargs(request)) as stream:
            async for delta in stream.text_stream:
                on_text(delta)
            return response_from_message(await stream.get_final_message())
