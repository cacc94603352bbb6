"""The `openai` backend: any OpenAI-compatible Chat Completions endpoint, via the official SDK (docs/agents.md#backends).

One `complete` is one `chat.completions.create`: streamed when the caller
listens (`on_text` gets each text delta, up to `max_output_chars`), a single
JSON answer otherwise; a streamed answer that came back empty is asked for
once more, unstreamed (backends/common.py `SdkBackend`). The SDK does the
retries (`max_retries`, for 429, 5xx and connection errors) with `timeout_s`
per attempt; an overall bound over all attempts stops a server that trickles
bytes forever. Every failure becomes `BackendError`.

Shapes: the system prompt is the first `system` message; a user message is a
string, or parts when it holds images (`image_url` with a data URL); an
assistant message carries `tool_calls` with JSON-encoded arguments; a tool
result is a `tool` message of text (Chat Completions takes no pixels there, so
its images read `[image]`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mcplhost.agents.backends.common import LoopTurns, SdkBackend, StreamedAnswer, block_text, tool_arguments
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

__all__ = ["OpenAIBackend", "request_kwargs"]

_FINISH_REASONS = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls", "length": "length"}


# --- request shapes (pure) ---------------------------------------------------


def _user_content(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if not any(b.get("type") == "image" for b in blocks):
        return block_text(blocks)
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if block.get("type") == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif block.get("type") == "image":
            url = f"data:{block.get('mimeType', 'image/png')};base64,{block.get('data', '')}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _message(message: Message) -> JsonObject:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": block_text(message.content)}
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": block_text(message.content) or None}
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                }
                for c in message.tool_calls
            ]
        return out
    return {"role": "user", "content": _user_content(message.content)}


def request_kwargs(request: ModelRequest, *, stream: bool) -> JsonObject:
    """The `chat.completions.create` arguments for a request."""
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    messages.extend(_message(m) for m in request.messages)
    kwargs: dict[str, Any] = {"model": request.model, "messages": messages, "max_tokens": request.max_tokens}
    if request.tools:
        kwargs["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
            }
            for t in request.tools
        ]
    if request.temperature is not None:
        kwargs["temperature"] = request.temperature
    if stream:
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


# --- answer shapes (pure) ----------------------------------------------------


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    details = getattr(usage, "prompt_tokens_details", None)
    return Usage(
        input_tokens=usage.prompt_tokens or 0,
        output_tokens=usage.completion_tokens or 0,
        cached_tokens=(getattr(details, "cached_tokens", None) or 0) if details is not None else 0,
    )


def _finish(reason: str | None, tool_calls: list[ToolCall]) -> str:
    if reason is None:
        return "tool_calls" if tool_calls else "stop"
    return _FINISH_REASONS.get(reason, reason)


def response_from_completion(completion: Any) -> ModelResponse:
    """A whole (non-streamed) ChatCompletion as a ModelResponse."""
    if isinstance(completion, str):  # the SDK's reading of a body that is not JSON (a proxy's HTML page)
        raise BackendError("malformed", "the answer is not JSON")
    if not completion.choices:
        raise BackendError("malformed", "the answer has no choices")
    choice = completion.choices[0]
    message = choice.message
    tool_calls = [
        ToolCall(id=c.id, name=c.function.name, arguments=tool_arguments(c.function.arguments, c.function.name))
        for c in (message.tool_calls or [])
        if getattr(c, "function", None) is not None
    ]
    return ModelResponse(
        text=message.content or "",
        tool_calls=tool_calls,
        finish_reason=_finish(choice.finish_reason, tool_calls),
        usage=_usage(completion.usage),
        model=completion.model or "",
    )


def _read_chunk(streamed: StreamedAnswer, chunk: Any) -> tuple[bool, str | None]:
    """One stream chunk into `streamed`: whether to read on (False once the text passed the bound), and the
    finish reason it gives, if any."""
    finish = None
    for choice in chunk.choices or []:
        if choice.index != 0:
            continue
        delta = choice.delta
        if delta is not None and delta.content and not streamed.text(delta.content):
            return False, None
        for piece in (delta.tool_calls if delta is not None else None) or []:
            function = piece.function
            streamed.tool_piece(piece.index, call_id=piece.id, name=function.name if function else None,
                                arguments=function.arguments if function else None)
        finish = choice.finish_reason or finish
    return True, finish


# --- the backend (I/O) -------------------------------------------------------


class OpenAIBackend(SdkBackend):
    """Chat Completions through `openai.AsyncOpenAI`, one client for the backend's life."""

    name = "openai"

    def __init__(self, config: BackendConfig, *, environ: Mapping[str, str]) -> None:
        import openai  # optional extra; make_backend checked it is importable

        super().__init__(config, environ=environ, sdk=openai, client_class=openai.AsyncOpenAI)

    async def _call(self, client: Any, request: ModelRequest, on_text: OnText | None) -> ModelResponse:
        if on_text is None:
            return response_from_completion(await client.chat.completions.create(**request_kwargs(request, stream=False)))
        streamed = StreamedAnswer(on_text, request.max_output_chars, max_arguments=RESPONSE_MAX_BYTES)
        finish: str | None = None
        usage: Any = None
        model = ""
        turns = LoopTurns()
        stream = await client.chat.completions.create(**request_kwargs(request, stream=True))
        async with stream:
            async for chunk in stream:
                model = chunk.model or model
                usage = chunk.usage if chunk.usage is not None else usage
                more, said = _read_chunk(streamed, chunk)
                finish = said or finish
                if not more:
                    break
                await turns.tick()
        tool_calls = streamed.tool_calls()
        return streamed.response(finish_reason=_finish(finish, tool_calls), usage=_usage(usage), model=model)
