"""Fixtures for the backend tests: the real local model server, and requests to send it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mcplhost.agents.model import Message, ModelRequest, ToolSpec
from tests.agents.llm_server import LlmServer, Reply

#: The variable the tests name in api_key_env, and the key it holds.
KEY_ENV = "MCPLHOST_TEST_MODEL_KEY"
KEY = "sk-test-0123"


@pytest.fixture
def llm_server() -> Iterator[LlmServer]:
    with LlmServer(Reply(text="echo: {{last_user}}")) as server:
        yield server


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def user(value: str) -> Message:
    return Message(role="user", content=[text(value)])


def simple_request(*messages: Message, tools: list[ToolSpec] | None = None, stable_prefix: int = 0) -> ModelRequest:
    return ModelRequest(
        model="test-model",
        system="You are a test.",
        messages=list(messages) or [user("[source: s / c]\nhello there")],
        tools=tools or [],
        stable_prefix=stable_prefix,
    )
