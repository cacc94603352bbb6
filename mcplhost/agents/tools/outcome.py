"""What a tool call answers the model: `ToolOutcome`, marked blocks, and a failure said in one line (docs/agents.md#tools).

    outcome = failure("channel_open: disc/x refused")   # is_error, one marked `[host]` line
    blocks, is_error = call_result_blocks(raw)          # an MCP tools/call result as marked blocks

A tool that fails is a result the model reads, never an exception; what a
connector returns is marked like an item body (docs/provenance.md §4) and
bounded (MAX_RESULT_BLOCKS blocks, CONNECTOR_ERROR_MAX_CHARS of an error).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from msgspec import UNSET, Raw

from mcplhost.inbound import mark_openings
from mcplhost.protocol.answers import ContentBlock, MalformedAnswer, ToolResult, decode_answer, decode_each
from mcplhost.secrets import Secrets

#: The method whose answers are read here (protocol/answers.py).
TOOLS_CALL = "tools/call"
#: Longest part of a connector's error text (or an exception naming its ids) a failed call shows.
CONNECTOR_ERROR_MAX_CHARS = 500
#: Content blocks read from one tools/call result; the rest are left out, and one line says how many.
MAX_RESULT_BLOCKS = 256


class ToolOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What the model reads back: content blocks (already marked) and whether the call failed."""

    blocks: list[dict[str, Any]]
    is_error: bool = False



def cut_error(text: object) -> str:
    """A connector's error text (or an exception holding its words) cut at CONNECTOR_ERROR_MAX_CHARS; marked later."""
    words = str(text)
    return words if len(words) <= CONNECTOR_ERROR_MAX_CHARS else words[:CONNECTOR_ERROR_MAX_CHARS] + "…"



def redacted_outcome(outcome: ToolOutcome, secrets: Secrets) -> ToolOutcome:
    """`outcome` with every secret value in its blocks replaced by `[redacted:NAME]` (docs/agents.md#secrets)."""
    if not secrets or secrets.find_json(outcome.blocks) is None:
        return outcome
    return ToolOutcome(blocks=secrets.redact_json(outcome.blocks), is_error=outcome.is_error)



def failure(text: str) -> ToolOutcome:
    """A failed call, said in one marked line the model reads."""
    return ToolOutcome(blocks=mark_openings([{"type": "text", "text": f"[host] {text}"}]), is_error=True)



def marked(text: str) -> str:
    """`text` with every opening marked (a connector's or sender's words, docs/provenance.md §4)."""
    return str(mark_openings([{"type": "text", "text": text}])[0]["text"])



def as_text(value: Any) -> ToolOutcome:
    """A host tool's JSON answer as one text block; its strings are marked by the caller, before encoding.

    Marking the encoded JSON instead would put a backslash before a `[`,
    which is no JSON escape: the model would read broken JSON.
    """
    return ToolOutcome(blocks=[{"type": "text", "text": json.dumps(value, ensure_ascii=False, sort_keys=True)}])



def result_blocks(result: ToolResult | MalformedAnswer) -> tuple[list[dict[str, Any]], bool]:
    """An MCP `tools/call` result as marked blocks the model can read, and its `isError`.

    Text and inline images pass; other blocks become a `[host]` line naming
    them; a result with only `structuredContent` is shown as its JSON.
    """
    if isinstance(result, MalformedAnswer):
        return [{"type": "text", "text": "[host] the tool answered something that is not an MCP result"}], True
    blocks: list[dict[str, Any]] = []
    for block in decode_each(result.content[:MAX_RESULT_BLOCKS], ContentBlock):
        if block is None:
            blocks.append({"type": "text", "text": "[host] a malformed block of the result is left out"})
        elif block.type == "text" and block.text is not None:
            blocks.append({"type": "text", "text": block.text})
        elif block.type == "image" and block.data is not None and block.mimeType is not None:
            blocks.append({"type": "image", "data": block.data, "mimeType": block.mimeType})
        else:
            blocks.append({"type": "text", "text": f"[host] a {block.type} block of the result is left out"})
    if len(result.content) > MAX_RESULT_BLOCKS:
        blocks.append({"type": "text", "text": f"[host] {len(result.content) - MAX_RESULT_BLOCKS} more blocks of the"
                                               f" result are left out (at most {MAX_RESULT_BLOCKS} are read)"})
    if not blocks and result.structuredContent is not UNSET:
        blocks.append({"type": "text", "text": json.dumps(result.structuredContent, ensure_ascii=False)})
    if not blocks:
        blocks.append({"type": "text", "text": "[host] the tool returned no content"})
    return mark_openings(blocks), result.isError



def call_result_blocks(raw: Raw | bytes) -> tuple[list[dict[str, Any]], bool]:
    """`result_blocks` of a `tools/call` answer as it came (protocol/answers.py `ToolResult`); pure."""
    try:
        result: ToolResult | MalformedAnswer = decode_answer(raw, ToolResult, TOOLS_CALL)
    except MalformedAnswer as exc:
        result = exc
    return result_blocks(result)
