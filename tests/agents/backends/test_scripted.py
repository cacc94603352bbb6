"""The scripted backend: replies in turn, the last repeating, {{echo}}, JSON replies with tool calls."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.agents.backends.scripted import ScriptedBackend, echo_text, parse_reply, script_problems
from mcplhost.agents.model import BackendError, Message, ToolCall
from mcplhost.config import BackendConfig, ScriptReply, ScriptToolCall
from tests.agents.backends.conftest import simple_request, text, user


async def test_replies_in_turn_then_the_last_repeats() -> None:
    """Each call takes the next reply; once the script runs out the last one answers every call."""
    backend = ScriptedBackend(["one", "two"])
    texts = [(await backend.complete(simple_request())).text for _ in range(4)]
    assert texts == ["one", "two", "two", "two"]


PLAIN_TEXT = st.text().filter(lambda s: "{{echo}}" not in s and not s.lstrip().startswith("{"))


@given(st.lists(PLAIN_TEXT, min_size=1), st.integers(min_value=1, max_value=20))
async def test_any_plain_script_is_replayed_exactly(script: list[str], calls: int) -> None:
    """For any plain-text script, call i answers script[min(i, last)], deterministically."""
    backend = ScriptedBackend(script)
    for i in range(calls):
        assert (await backend.complete(simple_request())).text == script[min(i, len(script) - 1)]


async def test_echo_is_the_waking_body_without_its_header() -> None:
    """{{echo}} is the last user message's text after its source header, skipping [host] notices."""
    request = simple_request(
        user("[source: s / c]\nolder"),
        user("[source: s / c · thread t]\nthe body\nsecond line"),
        user("[host] a notice"),
    )
    response = await ScriptedBackend(["you said: {{echo}}"]).complete(request)
    assert response.text == "you said: the body\nsecond line"


async def test_echo_is_the_turn_s_waking_text_not_the_newest_user_message() -> None:
    """A turn's request names its waking text: {{echo}} is that, whatever newer item the context holds."""
    request = msgspec.structs.replace(simple_request(
        user("[source: s / c]\nthe waking question"),
        user("[source: s / c]\na newer line that woke no one"),
    ), waking_text="the waking question")
    response = await ScriptedBackend(["you said: {{echo}}"]).complete(request)
    assert response.text == "you said: the waking question"
    assert echo_text(request.messages, "") == ""  # waking items without text echo nothing, not a neighbour


def test_echo_of_a_surface_item_keeps_its_whole_text() -> None:
    """An item without a source header (a surface item) echoes whole; no user message echoes nothing."""
    assert echo_text([user("no header here")]) == "no header here"
    assert echo_text([Message(role="assistant", content=[text("mine")])]) == ""


async def test_empty_script_echoes() -> None:
    """An empty script is the echo agent."""
    response = await ScriptedBackend([]).complete(simple_request())
    assert response.text == "hello there" and response.finish_reason == "stop"


async def test_json_reply_makes_tool_calls() -> None:
    """A JSON object reply gives text and tool calls, with ids unique across calls."""
    entry = (
        '{"text": "looking {{echo}}", "tool_calls": [{"name": "channel_list"}, {"name": "w", "arguments": {"a": 1}}]}'
    )
    backend = ScriptedBackend([entry])
    first = await backend.complete(simple_request())
    second = await backend.complete(simple_request())
    assert first.text == "looking hello there" and first.finish_reason == "tool_calls"
    assert first.tool_calls == [
        ToolCall(id="scripted-0-0", name="channel_list", arguments={}),
        ToolCall(id="scripted-0-1", name="w", arguments={"a": 1}),
    ]
    assert [c.id for c in second.tool_calls] == ["scripted-1-0", "scripted-1-1"]


async def test_config_tables_are_replies() -> None:
    """A script entry written as a TOML table (config.ScriptReply) works like its JSON form."""
    config = BackendConfig(script=[ScriptReply(text="t", tool_calls=[ScriptToolCall(name="x", arguments={"k": "v"})])])
    response = await ScriptedBackend(list(config.script)).complete(simple_request())
    assert response.tool_calls == [ToolCall(id="scripted-0-0", name="x", arguments={"k": "v"})]


async def test_on_text_gets_the_reply_and_usage_is_estimated() -> None:
    """on_text receives the reply's text; usage is a deterministic estimate, model "scripted" when none is set."""
    seen: list[str] = []
    request = msgspec.structs.replace(simple_request(), model="")
    response = await ScriptedBackend(["abcdefgh"]).complete(request, on_text=seen.append)
    assert seen == ["abcdefgh"]
    assert response.usage.output_tokens == 2 and response.usage.input_tokens > 0 and response.model == "scripted"


def test_braced_prose_is_text() -> None:
    """Text that opens with a brace but is not JSON is used as written."""
    assert parse_reply("{not json} but prose").text == "{not json} but prose"


async def test_malformed_script_fails_calls_not_construction() -> None:
    """A script whose object entries are malformed is named by script_problems, and each call fails bad_request."""
    script = ['{"tool_calls": [{"arguments": {}}]}', "[1]", '{"text": 3}', "fine"]
    assert [p.split(":")[0] for p in script_problems(script)] == ["script[0]", "script[2]"]
    backend = ScriptedBackend(script)
    with pytest.raises(BackendError) as caught:
        await backend.complete(simple_request())
    assert caught.value.reason == "bad_request" and "script[0]" in str(caught.value)
