"""The anthropic backend against a real local Messages server (tests/agents/llm_server.py)."""

from __future__ import annotations

import time

import pytest

from mcplhost.agents.backends import make_backend
from mcplhost.agents.backends.anthropic import CACHE_CONTROL, CONTEXT_OPENING, request_kwargs
from mcplhost.agents.model import BackendError, Message, ModelRequest, ToolCall, ToolSpec
from mcplhost.config import BackendConfig
from tests.agents.backends.conftest import KEY, KEY_ENV, backend_for, simple_request, user
from tests.agents.llm_server import LlmServer, Reply, ToolUse
from tests.builders import text

WEATHER = ToolSpec(name="weather__now", description="The weather now.", input_schema={"type": "object"})
PIXEL = "iVBORw0KGgo="


def tool_history(stable_prefix: int = 0) -> ModelRequest:
    call = ToolCall(id="toolu_1", name="weather__now", arguments={"city": "Oslo"})
    image = {"type": "image", "data": PIXEL, "mimeType": "image/jpeg"}
    return simple_request(
        user("[source: s / c]\nearlier"),
        Message(role="user", content=[text("[source: s / c]\nweather?"), image]),
        Message(role="assistant", content=[text("checking")], tool_calls=[call]),
        Message(role="tool", content=[text("sunny"), image], tool_call_id="toolu_1"),
        user("[host] a notice"),
        tools=[WEATHER],
        stable_prefix=stable_prefix,
    )


async def test_plain_call_returns_the_json_answer(llm_server: LlmServer) -> None:
    """Without on_text the backend makes one unstreamed call and returns text, usage and model."""
    llm_server.push(Reply(text="hello", input_tokens=10, cached_tokens=30))
    backend = backend_for(llm_server, "anthropic")
    response = await backend.complete(simple_request())
    await backend.aclose()
    assert (response.text, response.finish_reason, response.model) == ("hello", "stop", "test-model")
    assert (response.usage.input_tokens, response.usage.cached_tokens, response.usage.output_tokens) == (40, 30, 7)
    assert "stream" not in llm_server.requests[0].body


async def test_streamed_call_hands_on_text_each_delta(llm_server: LlmServer) -> None:
    """With on_text the call streams: several deltas arrive, and they join to the returned text."""
    llm_server.push(Reply(text="a streamed answer", cached_tokens=4))
    pieces: list[str] = []
    backend = backend_for(llm_server, "anthropic")
    response = await backend.complete(simple_request(), on_text=pieces.append)
    await backend.aclose()
    assert len(pieces) > 1 and "".join(pieces) == response.text == "a streamed answer"
    assert response.usage.cached_tokens == 4
    assert llm_server.requests[0].body["stream"] is True


@pytest.mark.parametrize("streamed", [False, True])
async def test_tool_use_comes_back_as_tool_calls(llm_server: LlmServer, streamed: bool) -> None:
    """tool_use blocks (streamed as partial JSON or whole) come back as ToolCalls, finish reason tool_calls."""
    calls = (
        ToolUse("toolu_a", "weather__now", {"city": "Oslo", "days": [1, 2]}),
        ToolUse("toolu_b", "channel_list", {}),
    )
    llm_server.push(Reply(text="let me look", tool_calls=calls))
    backend = backend_for(llm_server, "anthropic")
    response = await backend.complete(simple_request(tools=[WEATHER]), on_text=(lambda _: None) if streamed else None)
    await backend.aclose()
    assert response.tool_calls == [
        ToolCall(id="toolu_a", name="weather__now", arguments={"city": "Oslo", "days": [1, 2]}),
        ToolCall(id="toolu_b", name="channel_list", arguments={}),
    ]
    assert (response.text, response.finish_reason) == ("let me look", "tool_calls")


async def test_history_reaches_the_server_in_messages_shapes(llm_server: LlmServer) -> None:
    """Tools, images, tool_use and tool_result arrive as Messages shapes, same-role messages merged."""
    backend = backend_for(llm_server, "anthropic")
    await backend.complete(tool_history())
    await backend.aclose()
    body = llm_server.requests[0].body
    assert body["tools"] == [
        {"name": "weather__now", "description": "The weather now.", "input_schema": {"type": "object"}}
    ]
    assert body["system"] == [{"type": "text", "text": "You are a test.", "cache_control": CACHE_CONTROL}]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": PIXEL}}
    first, assistant, results = body["messages"]
    assert first == {
        "role": "user",
        "content": [
            {"type": "text", "text": "[source: s / c]\nearlier"},
            {"type": "text", "text": "[source: s / c]\nweather?"},
            image,
        ],
    }
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "checking"},
            {"type": "tool_use", "id": "toolu_1", "name": "weather__now", "input": {"city": "Oslo"}},
        ],
    }
    assert results == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}, image]},
            {"type": "text", "text": "[host] a notice"},
        ],
    }


def test_stable_prefix_is_marked_for_the_prompt_cache() -> None:
    """The last block of the stable prefix carries cache_control, and nothing after it does."""
    messages = request_kwargs(tool_history(stable_prefix=2))["messages"]
    marked = [(i, j) for i, m in enumerate(messages) for j, b in enumerate(m["content"]) if "cache_control" in b]
    assert marked == [(0, 2)]
    assert messages[0]["content"][2]["cache_control"] == CACHE_CONTROL
    assert len(messages) == 3  # the prefix boundary fell between two user messages, which stay apart


def test_no_stable_prefix_marks_only_the_system_prompt() -> None:
    """With stable_prefix 0 only the system block is marked."""
    kwargs = request_kwargs(tool_history())
    assert not any("cache_control" in b for m in kwargs["messages"] for b in m["content"])
    assert kwargs["system"][0]["cache_control"] == CACHE_CONTROL


def test_context_opening_with_the_assistant_gets_a_user_turn_first() -> None:
    """Dropped history leaving an assistant message first is opened by a [host] user turn; empty text is left out."""
    request = ModelRequest(
        model="m",
        system="",
        messages=[Message(role="assistant", content=[text("earlier reply")]), Message(role="user", content=[text("")])],
        temperature=0.3,
    )
    kwargs = request_kwargs(request)
    assert kwargs["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": CONTEXT_OPENING}]},
        {"role": "assistant", "content": [{"type": "text", "text": "earlier reply"}]},
    ]
    assert "system" not in kwargs and kwargs["extra_body"] == {"temperature": 0.3}


async def test_key_comes_from_api_key_env(llm_server: LlmServer) -> None:
    """The key sent is the value of the variable api_key_env names, never ANTHROPIC_API_KEY."""
    config = BackendConfig(kind="anthropic", model="m", base_url=llm_server.anthropic_base_url, api_key_env=KEY_ENV)
    backend = make_backend(config, environ={KEY_ENV: KEY, "ANTHROPIC_API_KEY": "must-not-leak"})
    await backend.complete(simple_request())
    await backend.aclose()
    headers = llm_server.requests[0].headers
    assert KEY in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))
    assert "must-not-leak" not in repr(headers)


async def test_missing_key_fails_the_call_without_a_request(llm_server: LlmServer) -> None:
    """An unset api_key_env variable is BackendError("missing_key") at call time, and nothing is sent."""
    config = BackendConfig(kind="anthropic", model="m", base_url=llm_server.anthropic_base_url, api_key_env=KEY_ENV)
    backend = make_backend(config, environ={})
    with pytest.raises(BackendError) as caught:
        await backend.complete(simple_request())
    await backend.aclose()
    assert caught.value.reason == "missing_key" and llm_server.requests == []


async def test_server_error_is_retried_by_the_sdk(llm_server: LlmServer) -> None:
    """A 500 is retried by the SDK (max_retries) and the retry's answer returned."""
    llm_server.push(Reply.error(500))
    backend = backend_for(llm_server, "anthropic", max_retries=1)
    response = await backend.complete(simple_request())
    await backend.aclose()
    assert response.text.startswith("echo:") and len(llm_server.requests) == 2


@pytest.mark.parametrize(("status", "reason"), [(429, "rate_limited"), (500, "server_error"), (401, "auth")])
async def test_error_statuses_name_their_reason(llm_server: LlmServer, status: int, reason: str) -> None:
    """After the retries an error status is BackendError with its reason."""
    llm_server.push(*[Reply.error(status)] * 3)
    backend = backend_for(llm_server, "anthropic", max_retries=1)
    with pytest.raises(BackendError) as caught:
        await backend.complete(simple_request(), on_text=lambda _: None)
    await backend.aclose()
    assert caught.value.reason == reason
    assert len(llm_server.requests) == (1 if status == 401 else 2)


@pytest.mark.parametrize("streamed", [False, True])
async def test_hang_past_the_timeout_fails_with_timeout(llm_server: LlmServer, streamed: bool) -> None:
    """A server that never answers fails the call with "timeout" after timeout_s."""
    llm_server.push(Reply(hang=True))
    backend = backend_for(llm_server, "anthropic", timeout_s=0.3, max_retries=0)
    started = time.monotonic()
    with pytest.raises(BackendError) as caught:
        await backend.complete(simple_request(), on_text=(lambda _: None) if streamed else None)
    elapsed = time.monotonic() - started
    await backend.aclose()
    assert caught.value.reason == "timeout" and 0.3 <= elapsed < 5


async def test_trickling_stream_is_bounded_overall(llm_server: LlmServer) -> None:
    """A stream that keeps sending bytes but never ends fails with "timeout" at the overall bound."""
    llm_server.push(Reply(trickle=True))
    backend = backend_for(llm_server, "anthropic", timeout_s=0.3, max_retries=0)
    started = time.monotonic()
    with pytest.raises(BackendError) as caught:
        await backend.complete(simple_request(), on_text=lambda _: None)
    elapsed = time.monotonic() - started
    await backend.aclose()
    assert caught.value.reason == "timeout" and 0.3 <= elapsed < 3


@pytest.mark.parametrize("streamed", [False, True])
async def test_malformed_answer_fails_with_malformed(llm_server: LlmServer, streamed: bool) -> None:
    """A body (or an SSE event) that is not JSON is BackendError("malformed")."""
    llm_server.push(Reply(malformed=True))
    backend = backend_for(llm_server, "anthropic", max_retries=0)
    with pytest.raises(BackendError) as caught:
        await backend.complete(simple_request(), on_text=(lambda _: None) if streamed else None)
    await backend.aclose()
    assert caught.value.reason == "malformed"
