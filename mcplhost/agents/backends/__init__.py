"""Model backends: `make_backend` turns an `[agents.backend]` table into a `Backend` (docs/agents.md#backends).

`make_backend` never raises for a backend that cannot work: a missing SDK
(`pip install 'mcplhost[openai]'`) or an unset `api_key_env` variable fails
each call with `BackendError` ("unavailable", "missing_key"), so the turn
stores `turn-failed` and the host and the other agents carry on.
`backend_problems` says so ahead of time, for check-config warnings.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

from mcplhost.agents.backends.scripted import ScriptedBackend, script_problems
from mcplhost.agents.model import Backend, BackendError, ModelRequest, ModelResponse, OnText
from mcplhost.config import BackendConfig

__all__ = ["UnavailableBackend", "backend_problems", "make_backend"]

#: The optional extra that brings each SDK.
EXTRAS = {"openai": "openai", "anthropic": "anthropic"}


class UnavailableBackend:
    """Stands in for a backend whose SDK is not installed: every call fails with "unavailable"."""

    def __init__(self, name: str, detail: str) -> None:
        self.name = name
        self._detail = detail

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse:
        raise BackendError("unavailable", self._detail)

    async def aclose(self) -> None:
        return None


def _sdk_installed(kind: str) -> bool:
    return importlib.util.find_spec(kind) is not None


def make_backend(backend: BackendConfig, *, environ: Mapping[str, str] = os.environ) -> Backend:
    """The backend a `BackendConfig` names; the key is read once, from `environ[backend.api_key_env]`."""
    if backend.kind == "scripted":
        return ScriptedBackend(list(backend.script))
    if not _sdk_installed(EXTRAS[backend.kind]):
        return UnavailableBackend(backend.kind, f"pip install 'mcplhost[{EXTRAS[backend.kind]}]'")
    if backend.kind == "openai":
        from mcplhost.agents.backends.openai import OpenAIBackend

        return OpenAIBackend(backend, environ=environ)
    from mcplhost.agents.backends.anthropic import AnthropicBackend

    return AnthropicBackend(backend, environ=environ)


def backend_problems(backend: BackendConfig) -> list[str]:
    """What would fail every call of this backend that the config checks cannot see: a missing SDK, a malformed script.

    (A missing model and an unset key variable are check-config's findings (mcplhost/config/rules.py).)
    """
    if backend.kind == "scripted":
        return script_problems(list(backend.script))
    if not _sdk_installed(EXTRAS[backend.kind]):
        return [f"the {backend.kind} package is not installed (pip install 'mcplhost[{EXTRAS[backend.kind]}]')"]
    return []
