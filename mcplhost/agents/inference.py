"""Server-initiated inference: `inference/request` and `model/info` through the `[inference]` backend (docs/agents.md#inference).

`ConnectorInference` implements the protocol layer's `InferenceService`
port (mcplhost/protocol/ports.py); host.py builds it when `[inference]` is
configured and hands it to every connection. The protocol layer authorizes
each request at receipt (the grant, the feature set,
`inferenceRequest.streaming` for `stream: true`, the loop guard) and hands
what passed to `admit`. Without `[inference]` there is no service, and
neither capability is offered, advertised or granted.

The request's messages are the connector's, passed through unchanged: no
host system prompt, no history, no hooks (SPEC §10: hooks are not run
for inferences a server started). The connector's own `system` messages, if
any, become the request's system text. The host's bounds still apply: the
backend's `max_tokens` caps `preferences.maxTokens`, and at most
`MAX_CONCURRENT_PER_CONNECTOR` requests of one connector are admitted at once:
the place is taken at receipt (`admit`), so a burst read in one chunk cannot
reach the model all together, and given back when the request ends, is
cancelled by the connector, or never starts.

Secrets never reach a connector this way either (docs/agents.md#secrets): an
answer holding a secret value is refused with reason `secret`, and a stream
holds back what may begin one (secrets.py `StreamGuard`), so its chunks stop
before the one that would carry it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import structlog

from mcplhost.agents.backends import make_backend
from mcplhost.agents.backends.common import block_text
from mcplhost.agents.model import Backend, BackendError, Message, ModelRequest, ModelResponse
from mcplhost.config import InferenceConfig
from mcplhost.jsonobject import JsonObject
from mcplhost.protocol.params import InferenceRequest
from mcplhost.protocol.ports import InferenceInvalid, InferenceRefused, SendChunk
from mcplhost.secrets import NO_SECRETS, Secrets, StreamGuard
from mcplhost.speech.withhold import SECRET

log = structlog.get_logger()

#: Requests of one connector served at once; one more is refused, never queued without bound.
MAX_CONCURRENT_PER_CONNECTOR = 4
#: Messages one request may carry.
MAX_MESSAGES = 1000
#: The wire's finishReason for each of the backends' stop words (anything else ended the turn).
FINISH_REASONS = {"stop": "end_turn", "end_turn": "end_turn", "length": "max_tokens", "max_tokens": "max_tokens",
                  "stop_sequence": "stop_sequence"}
#: Roles a connector's message may take; `system` ones become the system text.
ROLES = frozenset({"user", "assistant", "system"})
#: Characters of one `inference/chunk` delta: text that piled up while a chunk was written goes out in pieces
#: this long, so no chunk's line nears the outgoing line cap (rpc/limits.py MAX_OUTGOING_LINE_BYTES).
MAX_DELTA_CHARS = 256 * 1024


def message_of(raw: Any, index: int) -> Message | str:
    """One connector message as a backend `Message`, or (for role `system`) its text; ValueError when malformed.

    `content` is a string or a list of MCP content blocks, kept as they are.
    """
    if not isinstance(raw, dict):
        raise ValueError(f"messages[{index}] must be an object")
    role, content = raw.get("role"), raw.get("content")
    if role not in ROLES:
        raise ValueError(f"messages[{index}].role must be one of {sorted(ROLES)}")
    if isinstance(content, str):
        blocks = [{"type": "text", "text": content}]
    elif isinstance(content, list) and all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in content):
        blocks = list(content)
    else:
        raise ValueError(f"messages[{index}].content must be a string or a list of content blocks")
    if role == "system":
        return block_text(blocks)
    return Message(role=role, content=blocks)


def model_request(params: InferenceRequest, config: InferenceConfig) -> ModelRequest:
    """The backend request for `params`: its messages only, under the host's token cap; ValueError when malformed."""
    if not params.messages:
        raise ValueError("messages must not be empty")
    if len(params.messages) > MAX_MESSAGES:
        raise ValueError(f"at most {MAX_MESSAGES} messages")
    system: list[str] = []
    messages: list[Message] = []
    for index, raw in enumerate(params.messages):
        converted = message_of(raw, index)
        if isinstance(converted, str):
            system.append(converted)
        else:
            messages.append(converted)
    if not messages:
        raise ValueError("messages must hold a user or assistant message")
    backend = config.backend
    preferences = params.preferences or {}
    wanted = preferences.get("maxTokens")
    max_tokens = backend.max_tokens
    if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= 1:
        max_tokens = min(wanted, backend.max_tokens)  # the host's bound wins (docs/agents.md#inference)
    temperature = preferences.get("temperature")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 <= temperature <= 2:
        temperature = backend.temperature
    return ModelRequest(model=backend.model or backend.kind, system="\n\n".join(system), messages=messages,
                        max_tokens=max_tokens, temperature=temperature)


def inference_result(response: ModelResponse, fallback_model: str) -> JsonObject:
    """The wire result: the full content, the model that answered, finishReason in the spec's words, usage."""
    return {"content": response.text, "model": response.model or fallback_model,
            "finishReason": FINISH_REASONS.get(response.finish_reason, "end_turn"),
            "usage": {"inputTokens": response.usage.input_tokens, "outputTokens": response.usage.output_tokens}}


def model_info(config: InferenceConfig) -> JsonObject:
    """ModelInfo for the `[inference]` backend, from the config alone (docs/connectors.md)."""
    backend = config.backend
    return {"id": backend.model or backend.kind, "vendor": backend.kind, "contextWindow": config.context_window,
            "capabilities": ["streaming"]}


class _ChunkPump:
    """Streamed text to `inference/chunk` notifications, in order, from the backend's synchronous callback.

    Text that arrives while a chunk is being written is joined into the next
    one (cut at MAX_DELTA_CHARS), so the pending text is bounded by the answer
    itself, and nothing is dropped. Text passes the `StreamGuard` first: the
    tail that may begin a secret is sent only by `release_tail`, once the
    whole answer is known to hold none.
    """

    def __init__(self, request_id: Any, send: SendChunk, secrets: Secrets) -> None:
        self._request_id = request_id
        self._send = send
        self._guard = StreamGuard(secrets)
        self._pending: list[str] = []
        self._wake = anyio.Event()
        self._done = False
        self.index = 0

    @property
    def withheld(self) -> str | None:
        """The variable whose value the stream held (nothing from it on was sent), or None."""
        return self._guard.found

    def on_text(self, text: str) -> None:
        self._queue(self._guard.feed(text))

    def release_tail(self) -> None:
        """The answer is complete and holds no secret: the held-back tail goes out too."""
        self._queue(self._guard.finish())

    def _queue(self, text: str) -> None:
        if text and not self._done:
            self._pending.append(text)
            self._wake.set()

    def finish(self) -> None:
        self._done = True
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            while self._pending:
                text, self._pending = "".join(self._pending), []
                for start in range(0, len(text), MAX_DELTA_CHARS):
                    delta = text[start:start + MAX_DELTA_CHARS]
                    await self._send({"requestId": self._request_id, "index": self.index, "delta": delta})
                    self.index += 1
            if self._done:
                return


class ConnectorInference:
    """The `[inference]` backend as connectors reach it (the `InferenceService` port): one per host, shared."""

    def __init__(self, config: InferenceConfig, backend: Backend, *, secrets: Secrets = NO_SECRETS) -> None:
        self.config = config
        self.backend = backend
        #: The host's secret values (shared, updated in place on reload): never sent (docs/agents.md#secrets).
        self.secrets = secrets
        self._running: dict[str, int] = {}

    def model_info(self) -> JsonObject:
        return model_info(self.config)

    def statistics(self) -> dict[str, dict[str, int]]:
        """The places taken now, by connector (one not listed holds none): what `admit` counts against."""
        return {"running": dict(self._running)}

    def admit(self, server_id: str, params: InferenceRequest) -> AdmittedInference:
        """Check the messages, then take one of the connector's places (both at receipt).

        Raises InferenceInvalid for malformed messages and InferenceRefused
        ("busy") when the connector may not start another request now.
        """
        try:
            request = model_request(params, self.config)
        except ValueError as exc:
            raise InferenceInvalid(str(exc)) from None
        return AdmittedInference(self, server_id, params, request, self._take_place(server_id))

    def _take_place(self, server_id: str) -> Callable[[], None]:
        """One of the connector's places; returns what gives it back (idempotent)."""
        if self._running.get(server_id, 0) >= MAX_CONCURRENT_PER_CONNECTOR:
            raise InferenceRefused("busy", f"at most {MAX_CONCURRENT_PER_CONNECTOR} requests at once")
        self._running[server_id] = self._running.get(server_id, 0) + 1
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._running[server_id] -= 1
                if not self._running[server_id]:
                    del self._running[server_id]
        return release

    async def complete(self, server_id: str, params: InferenceRequest, request: ModelRequest, *,
                       request_id: Any = None, send_chunk: SendChunk | None = None) -> JsonObject:
        """Run one request `admit` let in (its caller gives the place back); streamed chunks all go out first.

        Raises InferenceRefused, with the backend's reason, when the backend
        fails, and with reason `secret` when the answer holds a secret value.
        """
        clog = log.bind(connector=server_id, featureSet=params.featureSet, conversationId=params.conversationId,
                        stream=params.stream)
        withheld: str | None = None
        try:
            if params.stream and send_chunk is not None:
                pump = _ChunkPump(request_id, send_chunk, self.secrets)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(pump.run)
                    try:
                        response = await self.backend.complete(request, on_text=pump.on_text)
                        result = inference_result(response, request.model)
                        withheld = pump.withheld or self.secrets.find_json(result)
                        if withheld is None:
                            pump.release_tail()
                    finally:
                        pump.finish()
                chunks = pump.index
            else:
                response = await self.backend.complete(request)
                result = inference_result(response, request.model)
                withheld = self.secrets.find_json(result)
                chunks = 0
        except BackendError as exc:
            clog.warning("inference.failed", reason=exc.reason, detail=exc.detail)
            raise InferenceRefused(exc.reason, exc.detail) from None
        if withheld is not None:
            # The variable is named in the log only; the connector learns the reason, never the value.
            clog.warning("inference.withheld", reason=SECRET, variable=withheld, chunks=chunks)
            raise InferenceRefused(SECRET, f"the answer holds the value of {withheld}; not sent")
        clog.info("inference.completed", model=result["model"], finishReason=result["finishReason"], chunks=chunks,
                  inputTokens=response.usage.input_tokens, outputTokens=response.usage.output_tokens)
        return result

    async def aclose(self) -> None:
        await self.backend.aclose()


class AdmittedInference:
    """One request `ConnectorInference.admit` let in (the `InferenceCall` port): its place is held until `release`."""

    def __init__(self, service: ConnectorInference, server_id: str, params: InferenceRequest, request: ModelRequest,
                 release: Callable[[], None]) -> None:
        self._service = service
        self._server_id = server_id
        self.params = params
        self.request = request
        self.release = release

    async def run(self, *, request_id: Any = None, send_chunk: SendChunk | None = None) -> JsonObject:
        return await self._service.complete(self._server_id, self.params, self.request, request_id=request_id,
                                            send_chunk=send_chunk)


def connector_inference(config: Any, *, secrets: Secrets = NO_SECRETS) -> ConnectorInference | None:
    """The service for a host's `Config`: None without `[inference]` (then nothing is offered or granted)."""
    if config.inference is None:
        return None
    return ConnectorInference(config.inference, make_backend(config.inference.backend), secrets=secrets)
