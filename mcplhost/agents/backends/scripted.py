"""The scripted backend: deterministic replies, no network (docs/agents.md#backends).

`script` lists the replies, used one per call in turn; once they run out the
last one repeats. An empty script answers `{{echo}}` every time (the echo
agent `mcplhost dev` shows). A reply is either

- text, where `{{echo}}` stands for the waking body: the text of the items
  that woke the turn, without their source headers (several are joined by a
  blank line), whatever newer item the context holds beside them. A request
  built outside a turn (no `waking_text`) falls back to the last user
  message that is not a `[host]` notice, after its source header line; or
- a JSON object `{"text": ..., "tool_calls": [{"name": ..., "arguments": {...}}]}`,
  written as a JSON string or, in TOML, as a table (config.ScriptReply). `{{echo}}` works in
  its text too. Tool call ids are `scripted-<call>-<index>`, unique per backend.

A reply's text is cut at the request's `max_output_chars` like any backend's
(agents/backends/answer_bounds.py); an empty reply is answered as it is (the script says so).

`script_problems` names what is wrong with a script, for check-config.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from mcplhost.agents.backends.answer_bounds import cut_answer
from mcplhost.agents.backends.common import block_text, estimated_tokens
from mcplhost.agents.model import (
    BackendError,
    Message,
    ModelRequest,
    ModelResponse,
    OnText,
    ToolCall,
    Usage,
)

__all__ = ["ECHO", "ScriptedBackend", "ScriptedReply", "echo_text", "parse_reply", "script_problems"]

ECHO = "{{echo}}"
DEFAULT_REPLY = ECHO
MODEL_NAME = "scripted"
_HEADER_OPENING = "[source:"
_NOTICE_OPENING = "[host]"


class ScriptedToolCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    arguments: dict[str, Any] = {}


class ScriptedReply(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One parsed script entry."""

    text: str = ""
    tool_calls: list[ScriptedToolCall] = []


def parse_reply(entry: str | dict[str, Any] | msgspec.Struct) -> ScriptedReply:
    """A script entry (text, a dict, or the config's table Struct) as a reply; ValueError says what is wrong."""
    if isinstance(entry, msgspec.Struct):
        entry = msgspec.to_builtins(entry)
    if isinstance(entry, str):
        if not entry.lstrip().startswith("{"):
            return ScriptedReply(text=entry)
        try:
            decoded = json.loads(entry)
        except json.JSONDecodeError:
            return ScriptedReply(text=entry)  # prose that happens to open with a brace
        if not isinstance(decoded, dict):
            raise ValueError("a JSON reply must be an object")
        entry = decoded
    try:
        return msgspec.convert(entry, ScriptedReply)
    except msgspec.ValidationError as e:
        raise ValueError(f"reply object: {e}") from None


def script_problems(script: list[Any]) -> list[str]:
    """Each malformed entry of a script, as `script[i]: why` (empty when all parse)."""
    problems = []
    for i, entry in enumerate(script):
        if not isinstance(entry, (str, dict, msgspec.Struct)):
            problems.append(f"script[{i}]: expected text or a table, got {type(entry).__name__}")
            continue
        try:
            parse_reply(entry)
        except ValueError as e:
            problems.append(f"script[{i}]: {e}")
    return problems


def echo_text(messages: list[Message], waking_text: str | None = None) -> str:
    """The waking body: the turn's waking text; without one, the last user message that is not a `[host]`
    notice, without its source header line."""
    if waking_text is not None:
        return waking_text
    for message in reversed(messages):
        if message.role != "user":
            continue
        text = block_text(message.content)
        if text.startswith(_NOTICE_OPENING):
            continue
        if text.startswith(_HEADER_OPENING):
            _, _, text = text.partition("\n")
        return text
    return ""


def _request_chars(request: ModelRequest) -> int:
    return len(request.system) + sum(len(block_text(m.content)) for m in request.messages)


class ScriptedBackend:
    """Replies from the script in turn; the last repeats."""

    name = "scripted"

    def __init__(self, script: list[Any] | None = None) -> None:
        entries = list(script or [DEFAULT_REPLY])
        problems = script_problems(entries)
        # A bad script fails every call (the turn stores turn-failed), not the host.
        self._problem = "; ".join(problems) or None
        self._replies = [] if problems else [parse_reply(e) for e in entries]
        self._calls = 0

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse:
        if self._problem is not None:
            raise BackendError("bad_request", f"scripted backend: {self._problem}")
        call = self._calls
        self._calls += 1
        reply = self._replies[min(call, len(self._replies) - 1)]
        text = reply.text.replace(ECHO, echo_text(request.messages, request.waking_text)) if ECHO in reply.text else reply.text
        if on_text is not None and text:
            on_text(text[: request.max_output_chars])  # as a real stream, read no further than the bound
        tool_calls = [
            ToolCall(id=f"scripted-{call}-{i}", name=c.name, arguments=dict(c.arguments))
            for i, c in enumerate(reply.tool_calls)
        ]
        usage = Usage(input_tokens=estimated_tokens(_request_chars(request)), output_tokens=estimated_tokens(len(text)))
        return cut_answer(ModelResponse(
            text=text,
            tool_calls=tool_calls,
            finish_reason="tool_calls" if tool_calls else "stop",
            usage=usage,
            model=request.model or MODEL_NAME,
        ), request.max_output_chars)

    async def aclose(self) -> None:
        return None
