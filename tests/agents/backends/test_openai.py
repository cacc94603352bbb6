"""The openai backend against a real local Chat Completions server (tests/agents/llm_server.py)."""

from __future__ import annotations

import time

import pytest

from mcplhost.agents.backends import make_backend
from mcplhost.agents.backends.common import NO_KEY_PLACEHOLDER
from mcplhost.agents.backends.openai import request_kwargs
from mcplhost.agents.model import BackendError, Message, ModelRequest, ToolCall, ToolSpec
from mcplhost.config import BackendConfig
from tests.agents.backends.conftest import KEY, KEY_ENV, backend_for, simple_request, user
from tests.agents.llm_server import LlmServer, Reply, ToolUse
from tests.builders import text

WEATHER = ToolSpec(
    name="weather__now",
    description="The weather now.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}},
)
PIXEL = "iVBORw0KGgo="


def tool_history() -> ModelRequest:
    call = ToolCall(id="call_1", name="weather__now", arguments={"city": "Oslo"})
    return simple_request(
        Message(
            role="user",
            content=[text("[source: s / c]\nweather?"), {"type": "image", "data": PIXEL, "mimeType": "image/png"}],
        ),
        Message(role="assistant", content=[text("checking")], tool_calls=[call]),
        Message(role="tool", content=[text("sunny")], tool_call_id="call_1"),
        tools=[WEATHER],
    )


async def test_plain_call_returns_the_json_answer(llm_server: LlmServer) -> None:
    """Without on_text the backend makes one unstreamed call and returns text, usage and model."""
    backend = backend_for(llm_server, "openai")
    response = await backend.complete(simple_request())
    await backend.aclose()
    assert response.text == "echo: [source: s / c]\nhello there"
    assert (response.finish_reason, response.model) == ("stop", "test-model")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (11, 7)
    assert "stream" not in llm_server.requests[0].body


async def test_streamed_call_hands_on_text_each_delta(llm_server: LlmServer) -> None:
    """With on_text the call streams: several deltas arrive, and they join to the returned text."""
    llm_server.push(Reply(text="a streamed answer", cached_tokens=5))
    pieces: list[str] = []
    backend = backend_for(llm_server, "openai")
    response = await backend.complete(simple_request(), on_text=pieces.append)
    await backend.aclose()
    assert len(pieces) > 1 and "".join(pieces) == response.text == "a streamed answer"
    assert response.usage.cached_tokens == 5 and response.usage.input_tokens == 11
    body = llm_server.requests[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("streamed", [False, True])
async def test_tool_calls_come_back_as_tool_calls(llm_server: LlmServer, streamed: bool) -> None:
    """The model's tool calls (streamed in pieces or whole) come back with ids and decoded arguments."""
    calls = (ToolUse("call_a", "weather__now", {"city": "Oslo"}), ToolUse("call_b", "channel_list", {}))
    llm_server.push(Reply(text="let me look", tool_calls=calls))
    backend = backend_for(llm_server, "openai")
    response = await backend.complete(simple_request(tools=[WEATHER]), on_text=(lambda _: None) if streamed else None)
    await backend.aclose()
    assert response.tool_calls == [
        ToolCall(id="call_a", name="weather__now", arguments={"city": "Oslo"}),
        ToolCall(id="call_b", name="channel_list", arguments={}),
    ]
    assert (response.text, response.finish_reason) == ("let me look", "tool_calls")


async def test_history_reaches_the_server_in_chat_completions_shapes(llm_server: LlmServer) -> None:
    """Tools, an image, an assistant's tool calls and the tool result arrive as Chat Completions shapes."""
    backend = backend_for(llm_server, "openai")
    await backend.complete(tool_history())
    await backend.aclose()
    body = llm_server.requests[0].body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "weather__now", "description": "The weather now.", "parameters": WEATHER.input_schema},
        }
    ]
    system, first, assistant, tool = body["messages"]
    assert system == {"role": "system", "content": "You are a test."}
    assert first["content"] == [
        {"type": "text", "text": "[source: s / c]\nweather?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
    ]
    assert assistant["content"] == "checking"
    assert assistant["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "weather__now", "arguments": '{"city": "Oslo"}'}}
    ]
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}


def test_request_kwargs_pass_temperature_and_plain_text_content() -> None:
    """A text-only user message is a plain string, and a configured temperature is sent."""
    request = ModelRequest(model="m", system="", messages=[user("hi")], temperature=0.5, max_tokens=9)
    kwargs = request_kwargs(request, stream=False)
    assert kwargs == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 9,
        "temperature": 0.5,
    }


async def test_key_comes_from_api_key_env(llm_server: LlmServer) -> None:
    """The key sent is the value of the variable api_key_env names."""
    backend = backend_for(llm_server, "openai")
    await backend.complete(simple_request())
    await backend.aclose()
    assert llm_server.requests[0].headers["authorization"] == f"Bearer {KEY}"


async def test_sdk_variable_is_never_read(llm_server: LlmServer) -> None:
    """Without api_key_env the SDK's own OPENAI_API_KEY is ignored: a placeholder goes instead."""
    config = BackendConfig(kind="openai", model="m", base_url=llm_server.openai_base_url)
    backend = make_backend(config, environ={"OPENAI_API_KEY": "must-not-leak"})
    await backend.complete(simple_request())
    await backend.aclose()
    assert llm_server.requests[0].headers["authorization"] == f"Bearer {NO_KEY_PLACEHOLDER}"


async def test_missing_key_fails_the_call_without_a_request(llm_server: LlmServer) -> None:
    """An unset api_key_env variable is BackendError("missing_key") at call time, and nothing is sent."""
    config = BackendConfig(kind="openai", model="m", base_url=llm_server.openai_base_url, api_key_env=KEY_ENV)
    backend = make_backend(config, environ={})
    with pytest.raises(BackendError) as caught:
        await backend.complete(simple_request())
    await backend.aclose()
    assert caught.value.reason == "missing_key" and KEY_ENV in str(caught.value)
    assert llm_server.requests == []


async def test_rate_limit_is_retried_by_the_sdk(llm_server: LlmServer) -> None:
    """A 429 is retried by the SDK (max_retries) and the retry's answer returned."""
    llm_server.push(Reply.error(429))
    backend = backend_for(llm_server, "openai", max_retries=1)
    response = await backend.complete(simple_request())
    await backend.aclose()
    assert response.text.startswith("echo:") and len(llm_server.requests) == 2


@pytest.mark.parametrize(("status", "reason"), [(429, "rate_limited"), (500, "server_error"), (400, "bad_request")])
async def test_error_statuses_name_their_reason(llm_server: LlmServer, status: int, reason: str) -> None:
    """After the retries an error status is BackendError with its reason; 4xx other than 429 is not retried."""
    llm_server.push(*[Reply.error(status)] * 3)
    backend = backend_for(llm_server, "openai", max_retries=1)
    with pytest.raises(BackendError) as caught:
        await backend.complete(simple_request())
    await backend.aclose()
    assert caught.value.reason == reason
    assert len(llm_server.requests) == (1 if status == 400 else 2)


@pytest.mark.parametrize("streamed", [False, True])
async def test_hang_past_the_timeout_fails_with_timeout(llm_server: LlmServer, streamed: bool) -> None:
    """A server that never answers fails the call with "timeout" once every attempt's timeout_s has passed."""
    llm_server.push(Reply(hang=True), Reply(hang=True))
    backend = backend_for(llm_server, "openai", timeout_s=0.3, max_retries=1)
    started = time.monotonic()
    with pytest.raises(BackendError) as caught:
        await backend.complete(simple_request(), on_text=(lambda _: None) if streamed else None)
    elapsed = time.monotonic() - started
    await backend.aclose()
    assert caught.value.reason == "timeout"
    assert len(llm_server.requests) == 2 and 0.6 <= elapsed < 5


async def test_trickling_stream_is_bounded_overall(llm_server: LlmServer) -> None:
    """A stream that keeps sending bytes but never ends fails with "timeout" at the overall bound."""
    llm_server.push(Reply(trickle=True))
    backend = backend_for(llm_server, "openai", timeout_s=0.3, max_retries=0)
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
    backend = backend_for(llm_server, "openai", max_retries=0)
    with pytest.raises(BackendError) as caught:
        await backend.complete(simple_request(), on_text=(lambda _: None) if streamed else None)
    await backend.aclose()
    assert caught.value.reason == "malformed"


async def test_connection_refused_fails_with_connection() -> None:
    """No server listening is BackendError("connection") after the retries."""
    with LlmServer() as server:
        url = server.openai_base_url
    config = BackendConfig(kind="openai", model="m", base_url=url, api_key_env=KEY_ENV, max_retries=0)
    backend = make_backend(config, environ={KEY_ENV: KEY})
    with pytest.raises(BackendError) as caught:
        await backend.complete(simple_request())
    await backend.aclose()
    assert caught.value.reason == "connection"
