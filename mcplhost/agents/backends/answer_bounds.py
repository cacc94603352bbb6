"""Bounds on what one model answer may make the host do (docs/agents.md#bounds): pure rules over a `ModelResponse`.

    response = cut_answer(response, request.max_output_chars)   # every backend, before returning
    if answer_is_empty(response): ...                          # the SDK backends: read again, or fail
    run, skipped = split_tool_calls(response.tool_calls, agent.max_tool_calls_per_round)

A model's answer is hostile until bounded like any other input: its text is
cut at `max_output_chars`, and only `max_tool_calls_per_round` of its tool
calls run; each of the others is answered with `not_run_text`, so the
history stays valid for every API (each call has its result) and the model
reads why.
"""

from __future__ import annotations

import msgspec

from mcplhost.agents.model import ModelResponse, ToolCall

#: The finish reason of an answer cut at `max_output_chars` (as for one that hit `max_tokens`).
CUT_FINISH = "length"


def cut_answer(response: ModelResponse, max_chars: int) -> ModelResponse:
    """`response` with its text cut at `max_chars`; a cut answer ends there, so its tool calls are dropped too.

    A stream is read no further once its text passes the bound (what came after it, tool calls included, is
    never read), and an answer read whole is cut the same way, so both give the same answer.
    """
    if len(response.text) <= max_chars:
        return response
    return msgspec.structs.replace(response, text=response.text[:max_chars], tool_calls=[], finish_reason=CUT_FINISH)


def answer_is_empty(response: ModelResponse) -> bool:
    """No text (or only whitespace) and no tool call: an answer that would end a turn saying nothing."""
    return not response.tool_calls and not response.text.strip()


def split_tool_calls(calls: list[ToolCall], limit: int) -> tuple[list[ToolCall], list[ToolCall]]:
    """The calls to run (the first `limit`) and the ones not run, their arguments dropped (never run, never kept)."""
    skipped = [ToolCall(id=call.id, name=call.name, arguments={}) for call in calls[limit:]]
    return calls[:limit], skipped


def not_run_text(total: int, limit: int) -> str:
    """The result each call past the limit gets: what happened, and what to do instead."""
    return (f"[host] not run: this answer asked for {total} tool calls and at most {limit} run per answer"
            " (max_tool_calls_per_round); ask again for the ones still needed.")
