"""Bounded model output at the backend (docs/agents.md#bounds), against the local model server through both SDKs.

An answer's text is cut at the request's `max_output_chars`, the same streamed (read no further) or not; a body
past `RESPONSE_MAX_BYTES`, one event line past `EVENT_LINE_MAX_BYTES` or a compressed body fails the call
(`too_large`, `malformed`) without the answer ever being held whole: the server's count of the bytes it got out
shows the client stopped reading.
"""

from __future__ import annotations

import anyio
import msgspec
import pytest

from mcplhost.agents.backends import common
from mcplhost.agents.backends import openai as openai_backend
from mcplhost.agents.backends.http import EVENT_LINE_MAX_BYTES, RESPONSE_MAX_BYTES
from mcplhost.agents.model import BackendError, ModelRequest
from tests.agents.backends.conftest import backend_for, simple_request
from tests.agents.llm_server import LlmServer, Reply, ToolUse
from tests.harness import wait_for

KINDS = ["openai", "anthropic"]
#: What the model server is told to answer where a hostile one answered 150 MB.
HUGE = 150 * 2**20
#: The most the server may get out before the client's stop reaches it: the bound, and the sockets' buffers.
STOPPED_BY = 24 * 2**20


def bounded(max_output_chars: int) -> ModelRequest:
    return msgspec.structs.replace(simple_request(), max_output_chars=max_output_chars)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk_chars", [1, 3, 8, 64])
async def test_a_long_answer_is_cut_alike_streamed_or_not(llm_server: LlmServer, kind: str, chunk_chars: int) -> None:
    """Cut at max_output_chars with finish `length` and its tool calls gone (the answer ends there); the streamed
    deltas join to exactly the cut text, whatever the chunk size."""
    reply = Reply(text="0123456789" * 10, chunk_chars=chunk_chars, tool_calls=(ToolUse("c1", "channel_list", {}),))
    llm_server.push(reply, reply)
    backend = backend_for(llm_server, kind, max_retries=0)
    whole = await backend.complete(bounded(35))
    pieces: list[str] = []
    streamed = await backend.complete(bounded(35), on_text=pieces.append)
    await backend.aclose()
    assert (whole.text, whole.finish_reason, whole.tool_calls) == (reply.text[:35], "length", [])
    assert (streamed.text, streamed.finish_reason, streamed.tool_calls) == (whole.text, "length", [])
    assert streamed.usage.output_tokens >= 35 // 4  # left before its usage came: the text read is counted
    assert "".join(pieces) == reply.text[:35]


@pytest.mark.parametrize("kind", KINDS)
async def test_an_answer_at_the_bound_is_not_cut(llm_server: LlmServer, kind: str) -> None:
    llm_server.push(Reply(text="x" * 35, tool_calls=(ToolUse("c1", "channel_list", {}),)))
    backend = backend_for(llm_server, kind, max_retries=0)
    response = await backend.complete(bounded(35), on_text=lambda _: None)
    await backend.aclose()
    assert (len(response.text), response.finish_reason, len(response.tool_calls)) == (35, "tool_calls", 1)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_150_mb_stream_is_read_only_to_max_output_chars(llm_server: LlmServer, kind: str) -> None:
    llm_server.push(Reply(huge=HUGE, chunk_chars=1 << 16))
    backend = backend_for(llm_server, kind, max_retries=0)
    pieces: list[str] = []
    response = await backend.complete(bounded(100_000), on_text=pieces.append)
    await backend.aclose()
    assert len(response.text) == 100_000 and response.finish_reason == "length"
    assert sum(map(len, pieces)) == 100_000
    (written,) = await wait_for(lambda: llm_server.written)
    assert written < STOPPED_BY


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "no content-length"])
async def test_a_150_mb_body_fails_too_large_as_it_passes_the_bound(llm_server: LlmServer, kind: str,
                                                                    declared: bool) -> None:
    """A declared length past the bound is refused before the body is read; an undeclared one as it passes it."""
    llm_server.push(Reply(huge=HUGE, declared=declared))
    backend = backend_for(llm_server, kind, max_retries=2)
    with pytest.raises(BackendError) as failed:
        await backend.complete(simple_request())
    await backend.aclose()
    assert failed.value.reason == "too_large" and str(RESPONSE_MAX_BYTES) in failed.value.detail
    (written,) = await wait_for(lambda: llm_server.written)
    assert written < STOPPED_BY
    assert len(llm_server.requests) == 1  # refused, not retried (the SDKs retry a connection error)


@pytest.mark.parametrize("kind", KINDS)
async def test_one_150_mb_event_fails_too_large(llm_server: LlmServer, kind: str) -> None:
    """An event stream may run long, one line of it may not: the SDK's decoder would hold it whole."""
    llm_server.push(Reply(huge=HUGE, one_event=True))
    backend = backend_for(llm_server, kind, max_retries=0)
    with pytest.raises(BackendError) as failed:
        await backend.complete(simple_request(), on_text=lambda _: None)
    await backend.aclose()
    assert failed.value.reason == "too_large" and str(EVENT_LINE_MAX_BYTES) in failed.value.detail
    (written,) = await wait_for(lambda: llm_server.written)
    assert written < STOPPED_BY


@pytest.mark.parametrize("kind", KINDS)
async def test_identity_is_asked_for_and_a_compressed_answer_is_refused(llm_server: LlmServer, kind: str) -> None:
    """A few KiB of gzip can inflate to gigabytes and the bound counts what arrives: a compressed answer is refused
    whatever it holds (here 8 MiB of text in some 8 KiB)."""
    llm_server.push(Reply(huge=8 * 2**20, gzip=True))
    backend = backend_for(llm_server, kind, max_retries=0)
    with pytest.raises(BackendError) as failed:
        await backend.complete(simple_request())
    await backend.aclose()
    assert failed.value.reason == "malformed" and "gzip" in failed.value.detail
    assert llm_server.requests[0].headers["accept-encoding"] == "identity"


@pytest.mark.parametrize("kind", KINDS)
async def test_3000_tool_calls_come_back_all_for_the_turn_to_bound(llm_server: LlmServer, kind: str) -> None:
    """The backend returns what the model asked for; the turn runs `max_tool_calls_per_round` of them."""
    calls = tuple(ToolUse(f"call_{n}", "channel_publish", {"text": f"spam {n}"}) for n in range(3000))
    llm_server.push(Reply(text="", tool_calls=calls))
    backend = backend_for(llm_server, kind, max_retries=0)
    response = await backend.complete(simple_request())
    await backend.aclose()
    assert [c.id for c in response.tool_calls] == [c.id for c in calls]


@pytest.mark.parametrize("arguments", [{"text": "y" * 100}, {}], ids=["long arguments", "no arguments"])
async def test_streamed_tool_calls_are_bounded_in_all(llm_server: LlmServer, monkeypatch: pytest.MonkeyPatch,
                                                      arguments: dict[str, str]) -> None:
    """Each piece of a streamed call is small, their sum is not: past the bound the call fails too_large; a call
    with no arguments counts too (CALL_CHARS), so many empty calls cannot fill the table of calls."""
    monkeypatch.setattr(openai_backend, "RESPONSE_MAX_BYTES", 1000)
    calls = tuple(ToolUse(f"call_{n}", "channel_publish", arguments) for n in range(20))
    llm_server.push(Reply(text="", tool_calls=calls))
    backend = backend_for(llm_server, "openai", max_retries=0)
    with pytest.raises(BackendError) as failed:
        await backend.complete(simple_request(), on_text=lambda _: None)
    await backend.aclose()
    assert failed.value.reason == "too_large" and "tool calls" in failed.value.detail


@pytest.mark.parametrize("kind", KINDS)
async def test_reading_a_stream_ticks_after_every_event(llm_server: LlmServer, kind: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader offers the loop its turn after each event (`LoopTurns.tick`): a fast server's events come
    buffered, many to one network read, and the SDK's iterator does not wait between them."""
    ticks = [0]
    tick = common.LoopTurns.tick

    async def counted(self: common.LoopTurns) -> None:
        ticks[0] += 1
        await tick(self)

    monkeypatch.setattr(common.LoopTurns, "tick", counted)
    llm_server.push(Reply(text="x" * 1600, chunk_chars=8))
    backend = backend_for(llm_server, kind, max_retries=0)
    response = await backend.complete(simple_request(), on_text=lambda _: None)
    await backend.aclose()
    assert len(response.text) == 1600 and ticks[0] >= 200  # 200 text events, and the others around them


async def test_a_due_tick_sleeps_so_the_loop_and_the_threads_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick past STREAM_YIELD_S is a real sleep of STREAM_PAUSE_S (the interpreter is let go), not a bare
    checkpoint: 50 due ticks take at least 50 pauses."""
    monkeypatch.setattr(common, "STREAM_YIELD_S", 0.0)
    turns = common.LoopTurns()
    began = anyio.current_time()
    for _ in range(50):
        await turns.tick()
    assert anyio.current_time() - began >= 50 * common.STREAM_PAUSE_S
