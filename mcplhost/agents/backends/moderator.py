"""`[moderation]` built into a `Moderator` (mcplhost/speech/moderation.py), and kind "openai" (docs/agents.md#moderation).

Kind "openai" lives here because only the model backends import the
providers' SDKs: one `AsyncOpenAI` client for the host's life, `base_url`
unchanged, the key read once from `api_key_env` (as a backend's), the SDK's
retries few and `timeout_s` bounding the whole check. Every failure refuses.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

import anyio
import structlog

from mcplhost.agents.backends.common import api_key
from mcplhost.config import DEFAULT_MODERATION_MODEL, ModerationConfig
from mcplhost.speech.moderation import CommandModerator, Moderator, Verdict, failure, flagged_verdict

log = structlog.get_logger()

#: The SDK's own retries of one moderation call (429, 5xx, connection errors), all within `timeout_s`.
MODERATION_MAX_RETRIES = 1


class OpenAIModerator:
    """Kind "openai": `moderations.create(model=..., input=text)`; flagged refuses, naming the categories."""

    def __init__(self, config: ModerationConfig, *, environ: Mapping[str, str] = os.environ) -> None:
        self._model = config.model or DEFAULT_MODERATION_MODEL
        self._timeout_s = config.timeout_s
        self._missing = ""
        self._client: Any = None
        key = api_key(config.api_key_env, environ)
        if importlib.util.find_spec("openai") is None:
            self._missing = "the openai package is not installed (pip install 'mcplhost[openai]')"
        elif key is None:
            self._missing = f"environment variable {config.api_key_env} is not set"
        else:
            import openai

            self._client = openai.AsyncOpenAI(api_key=key, base_url=config.base_url, timeout=config.timeout_s,
                                              max_retries=MODERATION_MAX_RETRIES)

    async def check(self, text: str, agent: str, destination: str) -> Verdict:
        if self._client is None:
            return failure(f"moderation unavailable: {self._missing}")
        try:
            with anyio.fail_after(self._timeout_s):
                response = await self._client.moderations.create(model=self._model, input=text)
            result = response.results[0]
            return flagged_verdict(result.flagged is True, result.categories.model_dump(by_alias=True))
        except TimeoutError:
            return failure(f"moderation endpoint gave no verdict within {self._timeout_s:g} s")
        except Exception as exc:  # fail-closed: whatever the SDK or the answer's shape raised refuses
            return failure(f"moderation endpoint failed: {type(exc).__name__}: {exc}")

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()


def make_moderator(config: ModerationConfig | None, *, withheld: frozenset[str] = frozenset(),
                   environ: Mapping[str, str] = os.environ) -> Moderator | None:
    """The host's one moderator, or None without `[moderation]`; `withheld`: the host's api key variables."""
    if config is None:
        return None
    log.info("moderation.enabled", kind=config.kind, timeout_s=config.timeout_s, streaming=False)
    if config.kind == "openai":
        return OpenAIModerator(config, environ=environ)
    return CommandModerator(config, withheld=withheld, environ=environ)
