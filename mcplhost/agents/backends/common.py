"""What every backend shares: the key from `api_key_env`, the overall bound, status words, block text.

Pure helpers, no SDK imports, so the scripted backend and check-config can use
them without the optional extras installed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import anyio
import structlog

from mcplhost.agents.model import BackendError, ModelRequest, ModelResponse, OnText
from mcplhost.config import BackendConfig

log = structlog.get_logger()

#: Sent as the key when `api_key_env` is not set: an OpenAI-compatible local server
#: (vLLM, llama.cpp, Ollama) ignores it, a hosted API answers 401 ("auth"). Passing
#: something keeps the SDKs from reading their own variables (OPENAI_API_KEY ...):
#: the key comes only from the variable the config names.
NO_KEY_PLACEHOLDER = "no-key-configured"

#: The SDKs' own retry backoff is capped near 8 s per wait (they honour a shorter
#: Retry-After); the overall bound of one call allows this much per retry.
RETRY_BACKOFF_ALLOWANCE_S = 8.0

#: Text standing in for an image where the target shape takes no pixels (docs/agents.md#compilation).
IMAGE_PLACEHOLDER = "[image]"


def api_key(api_key_env: str | None, environ: Mapping[str, str]) -> str | None:
    """The key for a backend: the named variable's value, the placeholder when none is named, None when it is unset."""
    if api_key_env is None:
        return NO_KEY_PLACEHOLDER
    value = environ.get(api_key_env)
    return value if value else None


def missing_key_error(api_key_env: str | None) -> BackendError:
    return BackendError("missing_key", f"environment variable {api_key_env} is not set")


def overall_timeout_s(timeout_s: float, max_retries: int) -> float:
    """One call's whole budget: every attempt's `timeout_s` plus the SDK's backoff between them.

    The SDKs' timeout bounds each read, not an attempt: a server that trickles
    bytes forever would otherwise hold a turn forever.
    """
    return timeout_s * (max_retries + 1) + RETRY_BACKOFF_ALLOWANCE_S * max_retries


def sdk_error(e: Exception, sdk: ModuleType, backend: str) -> BackendError:
    """The BackendError for what an official SDK raised; both SDKs name their errors alike."""
    if isinstance(e, BackendError):
        return e
    if isinstance(e, sdk.APITimeoutError):
        return BackendError("timeout", str(e))
    if isinstance(e, sdk.APIConnectionError):
        return BackendError("connection", str(e))
    if isinstance(e, sdk.APIStatusError):
        return BackendError(reason_for_status(e.status_code), f"HTTP {e.status_code}: {e.message}")
    if isinstance(e, (sdk.APIResponseValidationError, ValueError, KeyError, TypeError, AttributeError)):
        return BackendError("malformed", f"{type(e).__name__}: {e}")
    log.warning("backend.unexpected_error", backend=backend, exc_info=True)
    return BackendError("malformed", f"{type(e).__name__}: {e}")


class SdkBackend:
    """What both official-SDK backends share: the key, one client for the backend's life, the bounds, the errors.

    A subclass names its SDK and client class and implements `_call` (one
    request through that client); everything it raises becomes a BackendError.
    """

    name = ""

    def __init__(self, config: BackendConfig, *, environ: Mapping[str, str], sdk: ModuleType, client_class: Any) -> None:
        self._sdk = sdk
        self._config = config
        self._overall_s = overall_timeout_s(config.timeout_s, config.max_retries)
        key = api_key(config.api_key_env, environ)
        self._client = None if key is None else client_class(
            api_key=key, base_url=config.base_url, timeout=config.timeout_s, max_retries=config.max_retries)

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse:
        if self._client is None:
            raise missing_key_error(self._config.api_key_env)
        if not request.model:
            raise BackendError("bad_request", "no model configured")
        try:
            with anyio.fail_after(self._overall_s):
                return await self._call(self._client, request, on_text)
        except TimeoutError:
            raise BackendError("timeout", f"no whole answer within {self._overall_s:g} s") from None
        except Exception as e:  # every SDK failure is a BackendError (model.py)
            raise sdk_error(e, self._sdk, self.name) from e

    async def _call(self, client: Any, request: ModelRequest, on_text: OnText | None) -> ModelResponse:
        raise NotImplementedError

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()


def reason_for_status(status: int) -> str:
    """BackendError's reason for an HTTP status the SDK gave up on."""
    if status == 429:
        return "rate_limited"
    if status in (401, 403):
        return "auth"
    if status == 408:
        return "timeout"
    if status >= 500:
        return "server_error"
    return "bad_request"


def block_text(blocks: list[dict[str, Any]], *, image: str = IMAGE_PLACEHOLDER) -> str:
    """A block list as one text: text blocks joined by newlines, images as `[image]`, other blocks skipped."""
    parts: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "image":
            parts.append(image)
    return "\n".join(parts)


def estimated_tokens(chars: int) -> int:
    """A rough, deterministic token count (4 characters a token) for backends that do not report usage."""
    return math.ceil(chars / 4)
