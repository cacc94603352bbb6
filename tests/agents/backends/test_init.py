"""make_backend and backend_problems: the right backend per kind, and failures at call time, never at start."""

from __future__ import annotations

import pytest

import mcplhost.agents.backends as backends
from mcplhost.agents.backends import backend_problems, make_backend
from mcplhost.agents.backends.anthropic import AnthropicBackend
from mcplhost.agents.backends.openai import OpenAIBackend
from mcplhost.agents.backends.scripted import ScriptedBackend
from mcplhost.agents.model import BackendError
from mcplhost.config import BackendConfig
from tests.agents.backends.conftest import simple_request


async def test_each_kind_makes_its_backend() -> None:
    """scripted, openai and anthropic each make their own backend, named by kind."""
    made = [
        make_backend(BackendConfig(kind=kind, model="m", api_key_env="K"), environ={"K": "k"})
        for kind in ("scripted", "openai", "anthropic")
    ]
    assert [type(b) for b in made] == [ScriptedBackend, OpenAIBackend, AnthropicBackend]
    assert [b.name for b in made] == ["scripted", "openai", "anthropic"]
    for backend in made:
        await backend.aclose()


async def test_missing_sdk_fails_each_call_with_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the SDK installed, make_backend still returns a backend whose calls fail "unavailable"."""
    monkeypatch.setattr(backends, "_sdk_installed", lambda kind: False)
    backend = make_backend(BackendConfig(kind="openai", model="m"), environ={})
    with pytest.raises(BackendError) as caught:
        await backend.complete(simple_request())
    assert caught.value.reason == "unavailable" and "mcplhost[openai]" in str(caught.value)
    assert "not installed" in backend_problems(BackendConfig(kind="openai", model="m"))[0]


def test_backend_problems_name_what_would_fail() -> None:
    """backend_problems names a malformed script, and nothing for a backend whose SDK is installed."""
    assert backend_problems(BackendConfig(kind="openai", model="m", api_key_env="K")) == []
    assert backend_problems(BackendConfig(kind="scripted", script=["fine"])) == []
    [problem] = backend_problems(BackendConfig(kind="scripted", script=['{"text": 1}']))
    assert problem.startswith("script[0]")
