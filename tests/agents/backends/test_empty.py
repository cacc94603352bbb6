"""No silent empty answer (docs/agents.md#bounds): every way a server can answer nothing, against the local model
server through both official SDKs.

A streamed call that brings no text and no tool call (a stream request answered with plain JSON, an event stream
cut before any content, no events at all, a proxy's HTML page) is read again without streaming; an answer still
empty, streamed or not, fails with `malformed`. An answer with only tool calls is not empty.
"""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from mcplhost.agents.model import BackendError
from tests.agents.backends.conftest import backend_for, simple_request
from tests.agents.llm_server import LlmServer, Reply, ToolUse

KINDS = ["openai", "anthropic"]


def ignore(_: str) -> None:
    return None


#: Stream requests answered with nothing to stream, each as some real server or proxy does.
NOTHING_STREAMED = {
    "plain JSON": Reply(text="an answer that was not streamed", stream_as_json=True),
    "no events": Reply(text="never sent", cut_after=0),
    "cut before content": Reply(text="never sent", cut_after=1),
    "an HTML page": Reply(raw=("text/html", b"<html><body>Sign in to the proxy</body></html>")),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("misbehaviour", NOTHING_STREAMED.values(), ids=NOTHING_STREAMED.keys())
async def test_a_stream_that_brings_nothing_is_read_again_without_streaming(llm_server: LlmServer, kind: str,
                                                                          misbehaviour: Reply) -> None:
    llm_server.push(misbehaviour, Reply(text="the answer"))
    backend = backend_for(llm_server, kind, max_retries=0)
    with capture_logs() as logs:
        response = await backend.complete(simple_request(), on_text=ignore)
        await backend.aclose()
    assert (response.text, response.finish_reason) == ("the answer", "stop")
    first, second = llm_server.requests
    assert first.body["stream"] is True and not second.body.get("stream")
    (said,) = [e for e in logs if e["event"] == "backend.empty_stream_read_again"]
    assert said["log_level"] == "warning" and said["backend"] == kind


async def test_the_read_again_is_said_once_as_a_warning_then_quietly(llm_server: LlmServer) -> None:
    """A proxy that never streams would warn on every turn: the warning is once per backend, then info."""
    backend = backend_for(llm_server, "openai", max_retries=0)
    llm_server.default = Reply(text="plain", stream_as_json=True)
    with capture_logs() as logs:
        for _ in range(3):
            assert (await backend.complete(simple_request(), on_text=ignore)).text == "plain"
        await backend.aclose()
    levels = [e["log_level"] for e in logs if e["event"] == "backend.empty_stream_read_again"]
    assert levels == ["warning", "info", "info"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("text", ["", " \n\t "], ids=["no text", "only blanks"])
async def test_an_answer_with_no_text_and_no_tool_call_fails_malformed(llm_server: LlmServer, kind: str,
                                                                       streamed: bool, text: str) -> None:
    llm_server.default = Reply(text=text)
    backend = backend_for(llm_server, kind, max_retries=0)
    with pytest.raises(BackendError) as failed:
        await backend.complete(simple_request(), on_text=ignore if streamed else None)
    await backend.aclose()
    assert failed.value.reason == "malformed" and "no text and no tool call" in failed.value.detail
    assert len(llm_server.requests) == (2 if streamed else 1)  # a stream is read once more, unstreamed


@pytest.mark.parametrize("kind", KINDS)
async def test_a_page_that_is_not_json_fails_malformed(llm_server: LlmServer, kind: str) -> None:
    llm_server.push(Reply(raw=("text/html", b"<html>Sign in</html>")))
    backend = backend_for(llm_server, kind, max_retries=0)
    with pytest.raises(BackendError) as failed:
        await backend.complete(simple_request())
    await backend.aclose()
    assert (failed.value.reason, failed.value.detail) == ("malformed", "the answer is not JSON")


@pytest.mark.parametrize("kind", KINDS)
async def test_tool_calls_alone_are_an_answer(llm_server: LlmServer, kind: str) -> None:
    """No text but a tool call: returned as it is, streamed once."""
    llm_server.push(Reply(text="", tool_calls=(ToolUse("call_1", "channel_list", {}),)))
    backend = backend_for(llm_server, kind, max_retries=0)
    response = await backend.complete(simple_request(), on_text=ignore)
    await backend.aclose()
    assert [c.name for c in response.tool_calls] == ["channel_list"] and len(llm_server.requests) == 1
