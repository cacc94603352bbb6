"""Fixtures for the backend tests: the real local model server, and requests to send it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mcplhost.agents.backends import make_backend
from mcplhost.agents.model import Backend, Message, ModelRequest, ToolSpec
from mcplhost.config import BackendConfig
from tests.agents.llm_server import LlmServer, Reply

from ...builders import text

#: The variable the tests name in api_key_env, and the key it holds.
KEY_ENV = "MCPLHOST_TEST_MODEL_KEY"
KEY = "sk-test-0123"


@pytest.fixture
def llm_server() -> Iterator[LlmServer]:
    with LlmServer(Reply(text="echo: {{last_user}}")) as server:
        yield server


def backend_for(server: LlmServer, kind: str, **overrides: object) -> Backend:
    """A `kind` backend ("openai" or "anthropic") against `server`, with the test key; `overrides`: BackendConfig's."""
    url = server.openai_base_url if kind == "openai" else server.anthropic_base_url
    keys = {"kind": kind, "model": "test-model", "base_url": url, "api_key_env": KEY_ENV, **overrides}
    return make_backend(BackendConfig(**keys), environ={KEY_ENV: KEY})  # type: ignore[arg-type]


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
