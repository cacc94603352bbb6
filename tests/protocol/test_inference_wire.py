"""Server-initiated inference on the wire: inference/request (streamed and not) and model/info.

SPEC §11 and docs/agents.md#inference: gated by the grant, `[inference]` and the
feature set; refused -32600 while the connector's own beforeInference is
pending; the connector's messages reach the model unchanged. Every connector
is the scripted connector in memory (tests/memory_pair.py) before the host's
real connection, the model the scripted backend or the openai backend against
tests/agents/llm_server.py.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest
import structlog

from mcplhost.agents import inference
from mcplhost.agents.backends.scripted import ScriptedBackend
from mcplhost.agents.inference import MAX_CONCURRENT_PER_CONNECTOR, ConnectorInference, model_request
from mcplhost.config import AgentConfig, BackendConfig, Config, ConnectorConfig, InferenceConfig
from mcplhost.protocol.connection import McplConnection, Mode
from mcplhost.protocol.errors import ConnectorProtocolError
from mcplhost.protocol.featuresets import FeatureSetState
from mcplhost.protocol.params import InferenceRequest
from mcplhost.protocol.ports import InferenceInvalid, InferenceRefused
from mcplhost.secrets import Secrets

from ..agents.llm_server import LlmServer, Reply
from ..agents.support import FailingBackend, RecordingBackend
from ..harness import (
    CHAT_GRANT,
    config_with,
    error_of,
    gone_session,
    record,
    result_of,
    scripted,
    wait_for,
)
from ..memory_pair import memory_host

INFERENCE_GRANT = ["inferenceRequest", "inferenceRequest.streaming", "modelInfo"]
MANIFEST: dict[str, Any] = {
    "version": "0.5",
    "inferenceRequest": {"streaming": True},
    "modelInfo": True,
    "featureSets": {
        "think": {"description": "asks the model", "uses": ["inferenceRequest", "inferenceRequest.streaming"]},
        "other": {"description": "declares no inference", "uses": ["modelInfo"]},
    },
}
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 2+2?"}]


def ask(stream: bool = False, feature_set: str = "think", **extra: Any) -> dict[str, Any]:
    return {"request": "inference/request",
            "params": {"featureSet": feature_set, "stream": stream, "messages": MESSAGES, **extra}}


INFO = {"request": "model/info", "params": {}}


def with_inference(config: Config, backend: BackendConfig, **agents: Any) -> Config:
    return Config(store=config.store, connectors=config.connectors,
                  inference=InferenceConfig(backend=backend, context_window=32_000), **agents)


def connector(tmp_path, name: str, steps: list[dict[str, Any]], **fields: Any):
    script = {"manifest": fields.pop("manifest", MANIFEST), "steps": steps, **fields.pop("script", {})}
    return scripted(name, script, tmp_path, grant=fields.pop("grant", INFERENCE_GRANT), **fields)


def chunks(rec: Any) -> list[dict[str, Any]]:
    return [m["params"] for m in rec.received if m.get("method") == "inference/chunk"]


def offered_by_host(rec: Any) -> dict[str, Any]:
    first = next(m for m in rec.received if m.get("method") == "initialize")
    return first["params"]["capabilities"]["experimental"]["mcpl"]


SCRIPTED = BackendConfig(kind="scripted", script=["four"])


class TestWithoutInference:
    async def test_nothing_is_advertised_granted_or_served(self, tmp_path) -> None:
        """Without [inference] the host advertises neither capability, grants neither, and refuses both -32002."""
        spec = connector(tmp_path, "plain", [ask(), INFO])
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "plain").done)
        rec = record(tmp_path, "plain")
        offered = offered_by_host(rec)
        assert "inferenceRequest" not in offered and "modelInfo" not in offered
        assert error_of(rec, 0)["code"] == -32002
        assert error_of(rec, 0)["data"]["capability"] == "inferenceRequest"
        assert error_of(rec, 1)["data"]["capability"] == "modelInfo"


class TestWithInference:
    async def test_model_info_and_an_unstreamed_request(self, tmp_path) -> None:
        """With [inference] and the grant, model/info answers ModelInfo and a request answers the full content."""
        spec = connector(tmp_path, "asker", [INFO, ask()])
        async with memory_host(with_inference(config_with(tmp_path, spec), SCRIPTED)):
            await wait_for(lambda: record(tmp_path, "asker").done)
        rec = record(tmp_path, "asker")
        assert offered_by_host(rec)["inferenceRequest"] == {"streaming": True}
        assert result_of(rec, 0) == {"id": "scripted", "vendor": "scripted", "contextWindow": 32_000,
                                     "capabilities": ["streaming"]}
        result = result_of(rec, 1)
        assert result["content"] == "four" and result["finishReason"] == "end_turn"
        assert result["model"] == "scripted" and set(result["usage"]) == {"inputTokens", "outputTokens"}
        assert chunks(rec) == []  # not streamed: no chunk

    async def test_a_streamed_request_sends_its_chunks_first(self, tmp_path) -> None:
        """stream:true sends inference/chunk (requestId, rising index) before the answer, which has the full text."""
        spec = connector(tmp_path, "streamer", [ask(stream=True)])
        async with memory_host(with_inference(config_with(tmp_path, spec), SCRIPTED)):
            await wait_for(lambda: record(tmp_path, "streamer").done)
        rec = record(tmp_path, "streamer")
        request_id = next(m["id"] for m in rec.sent if m.get("method") == "inference/request")
        got = chunks(rec)
        assert got and all(c["requestId"] == request_id for c in got)
        assert [c["index"] for c in got] == list(range(len(got)))
        assert "".join(c["delta"] for c in got) == result_of(rec, 0)["content"] == "four"
        answer_at = next(i for i, m in enumerate(rec.received) if m.get("id") == request_id and "method" not in m)
        last_chunk_at = max(i for i, m in enumerate(rec.received) if m.get("method") == "inference/chunk")
        assert last_chunk_at < answer_at

    async def test_grants_and_feature_sets_gate_each_request(self, tmp_path) -> None:
        """Streaming needs its own grant, modelInfo its own, and the feature set must declare inferenceRequest."""
        plain = {**MANIFEST, "featureSets": {"think": {"description": "asks", "uses": ["inferenceRequest"]}}}
        no_stream = connector(tmp_path, "nostream", [ask(stream=True), ask(), INFO], grant=["inferenceRequest"],
                              manifest=plain)
        mismatch = connector(tmp_path, "mismatch", [ask(feature_set="other"), ask(feature_set="nope")])
        bad = connector(tmp_path, "bad", [{"request": "inference/request", "params": {"featureSet": "think"}},
                                          ask(messages=[{"role": "robot", "content": "x"}]),
                                          ask(messages=[])])
        config = with_inference(config_with(tmp_path, no_stream, mismatch, bad), SCRIPTED)
        async with memory_host(config):
            await wait_for(lambda: all(record(tmp_path, n).done for n in ("nostream", "mismatch", "bad")))
        rec = record(tmp_path, "nostream")
        assert error_of(rec, 0) == {"code": -32002, "message": "Capability denied",
                                    "data": {"capability": "inferenceRequest.streaming"}}
        assert result_of(rec, 1)["content"] == "four"
        assert error_of(rec, 2)["data"] == {"capability": "modelInfo"}
        rec = record(tmp_path, "mismatch")
        assert error_of(rec, 0)["data"] == {"featureSet": "other", "capability": "inferenceRequest",
                                            "reason": "declaration_mismatch"}
        assert error_of(rec, 1)["code"] == -32003
        rec = record(tmp_path, "bad")
        assert [error_of(rec, step)["code"] for step in range(3)] == [-32602, -32602, -32602]


class TestPassThrough:
    async def test_the_connectors_messages_reach_the_model_unchanged(self, tmp_path) -> None:
        """Through the openai backend the model sees the connector's messages and nothing of the host's."""
        with LlmServer(default=Reply(text="model says four", input_tokens=7, output_tokens=3)) as llm:
            spec = connector(tmp_path, "asker", [ask(stream=True, preferences={"maxTokens": 50})])
            backend = BackendConfig(kind="openai", model="test-model", base_url=llm.openai_base_url, timeout_s=10,
                                    max_tokens=200)
            async with memory_host(with_inference(config_with(tmp_path, spec), backend)):
                await wait_for(lambda: record(tmp_path, "asker").done)
            requests = llm.requests
        rec = record(tmp_path, "asker")
        result = result_of(rec, 0)
        assert result["content"] == "model says four" and result["model"]
        assert result["usage"] == {"inputTokens": 7, "outputTokens": 3}
        assert chunks(rec)  # the SDK backend streams (deltas arriving together are joined into one chunk)
        assert "".join(c["delta"] for c in chunks(rec)) == "model says four"
        (sent,) = requests
        messages = sent.body["messages"]
        assert [(m["role"], _text(m["content"])) for m in messages] == [("system", "be brief"),
                                                                         ("user", "what is 2+2?")]
        assert sent.body.get("tools") in (None, [])  # no host tools, no host context
        assert (sent.body.get("max_tokens") or sent.body.get("max_completion_tokens")) == 50


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content)


ROOM = "hooked:room"
HOOKED_MANIFEST: dict[str, Any] = {
    **MANIFEST,
    "channels": {"register": True, "incoming": True},
    "contextHooks": {"beforeInference": {"observe": True}},
    "featureSets": {"think": {"description": "chat and ask", "uses": [
        "inferenceRequest", "channels.register", "channels.incoming", "contextHooks.beforeInference.observe"]}},
}


class TestLoopGuard:
    async def test_a_request_while_its_own_hook_is_pending_is_refused(self, tmp_path) -> None:
        """While the host awaits this connector's beforeInference, its inference/request gets -32600; after, it runs."""
        register = {"request": "channels/register", "params": {"channels": [
            {"id": ROOM, "type": "t", "direction": "bidirectional", "address": {}, "label": "#room"}]}}
        mention = {"request": "channels/incoming", "params": {"messages": [
            {"channelId": ROOM, "messageId": "m-1", "author": {"id": "u-1", "name": "Ann"},
             "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": "bot?"}],
             "tags": ["chat:addressed"]}]}}
        steps = [register, mention, {"wait": "context/beforeInference"}, ask(),
                 {"wait": "inference/lifecycle"}, ask()]
        spec = connector(tmp_path, "hooked", steps, manifest={**HOOKED_MANIFEST, "inferenceLifecycle": True},
                         grant=[*CHAT_GRANT, "inferenceRequest", "contextHooks.beforeInference.observe",
                                "inferenceLifecycle"],
                         script={"handlers": {"context/beforeInference": {
                             "delay": 1.0, "result": {"featureSet": "think", "contextInjections": []}}}})
        agent = AgentConfig(name="scout", wake_on=["addressed"], debounce_ms=0,
                            backend=BackendConfig(kind="scripted", script=["hi"]))
        config = with_inference(config_with(tmp_path, spec), SCRIPTED, agents=[agent])
        async with memory_host(config):
            await wait_for(lambda: record(tmp_path, "hooked").done, timeout=30)
        rec = record(tmp_path, "hooked")
        refused = error_of(rec, 3)
        assert refused["code"] == -32600 and refused["data"] == {"reason": "hook_pending"}
        assert result_of(rec, 5)["content"] == "four"


class Pending:
    """The loop guard's port with a fixed answer: these connectors' beforeInference is outstanding."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def hook_pending(self, connector_name: str) -> bool:
        return connector_name in self.names


class TestLoopGuardRule:
    async def test_a_pending_hook_refuses_only_its_own_connector(self) -> None:
        """The guard names the connector whose beforeInference is outstanding: -32600 for it, the model for others."""
        service = ConnectorInference(InferenceConfig(backend=SCRIPTED), ScriptedBackend(["four"]))
        think = FeatureSetState(name="think", enabled=True, reason=None, uses=frozenset({"inferenceRequest"}))
        body = msgspec.json.encode({"featureSet": "think", "messages": MESSAGES})
        answers: dict[str, Any] = {}
        for name in ("hooked", "other"):
            conn = McplConnection(ConnectorConfig(name=name, command=["unused"]), gone_session(), None,  # type: ignore[arg-type]
                                  structlog.get_logger(), inference=service, hooks=Pending({"hooked"}))
            conn.mode, conn.grant, conn.feature_sets = Mode.READY, frozenset({"inferenceRequest"}), {"think": think}
            try:
                answers[name] = await (await conn.on_request("inference/request", msgspec.Raw(body))).work()
            except ConnectorProtocolError as exc:
                answers[name] = (exc.code, exc.data)
            finally:
                conn.close_jobs()
                await conn.run_background()
                await conn.session.run()
        assert answers["hooked"] == (-32600, {"reason": "hook_pending"})
        assert answers["other"]["content"] == "four"
        assert service._running == {}  # the refused request never took a place; the served one gave it back


class TestPort:
    """ConnectorInference's own bounds, without a connector."""

    PARAMS = InferenceRequest(featureSet="think", messages=MESSAGES)

    def _port(self) -> ConnectorInference:
        return ConnectorInference(InferenceConfig(backend=SCRIPTED), ScriptedBackend(["four"]))

    async def test_a_place_is_taken_at_admission_and_given_back_once(self) -> None:
        """admit takes the place (so a burst cannot overrun the bound); its release is idempotent."""
        port = self._port()
        calls = [port.admit("c", self.PARAMS) for _ in range(MAX_CONCURRENT_PER_CONNECTOR)]
        with pytest.raises(InferenceRefused):
            port.admit("c", self.PARAMS)
        calls[0].release()
        calls[0].release()  # twice gives back one place, not two
        port.admit("c", self.PARAMS)
        with pytest.raises(InferenceRefused):
            port.admit("c", self.PARAMS)
        assert (await calls[1].run())["content"] == "four"

    async def test_past_the_bound_a_request_is_refused_busy(self) -> None:
        """With MAX_CONCURRENT_PER_CONNECTOR requests running, one more of that connector is refused."""
        release = anyio.Event()
        started = []

        class Held(ScriptedBackend):
            async def complete(self, request, *, on_text=None):  # type: ignore[no-untyped-def]
                started.append(request)
                await release.wait()
                return await super().complete(request, on_text=on_text)

        port = ConnectorInference(InferenceConfig(backend=SCRIPTED), Held(["four"]))
        async with anyio.create_task_group() as tg:
            for _ in range(MAX_CONCURRENT_PER_CONNECTOR):
                call = port.admit("c", self.PARAMS)  # held: the port's caller gives it back
                tg.start_soon(lambda call=call: call.run())
            while len(started) < MAX_CONCURRENT_PER_CONNECTOR:
                await anyio.sleep(0)
            with pytest.raises(InferenceRefused) as refused:
                port.admit("c", self.PARAMS)
            assert refused.value.reason == "busy"
            port.admit("other", self.PARAMS)  # the bound is per connector
            release.set()

    def test_malformed_messages_are_refused_before_a_place_is_taken(self) -> None:
        """Messages no model request can carry are InferenceInvalid, and cost the connector no place."""
        port = self._port()
        for messages in ([], [{"role": "robot", "content": "x"}], [{"role": "system", "content": "only"}]):
            with pytest.raises(InferenceInvalid):
                port.admit("c", InferenceRequest(featureSet="think", messages=messages))
        assert port._running == {}

    async def test_a_backend_failure_is_refused_with_its_reason(self) -> None:
        """The backend's own error becomes the protocol's InferenceRefused, reason kept; the place is the caller's."""
        port = ConnectorInference(InferenceConfig(backend=SCRIPTED), FailingBackend("rate_limited"))
        call = port.admit("c", self.PARAMS)
        with pytest.raises(InferenceRefused) as refused:
            await call.run()
        assert refused.value.reason == "rate_limited"
        call.release()
        assert port._running == {}

    async def test_a_stream_goes_in_bounded_deltas_and_stops_before_a_secret(self, monkeypatch) -> None:
        """Text streamed in long pieces goes out in deltas of at most MAX_DELTA_CHARS; an answer holding a secret
        is refused `secret`, its deltas all from before the value; a clean answer's deltas rebuild it."""
        monkeypatch.setattr(inference, "MAX_DELTA_CHARS", 10)
        secret = "sk-secret-0123456789"

        class Pieces(RecordingBackend):
            async def complete(self, request, *, on_text=None):  # type: ignore[no-untyped-def]
                for piece in self.text.split("|"):
                    on_text(piece)
                return msgspec.structs.replace(await super().complete(request), text=self.text.replace("|", ""))

        for text, refused in (("a" * 45 + "|" + secret + " tail", True), ("b" * 35 + "|" + "c" * 5, False)):
            port = ConnectorInference(InferenceConfig(backend=SCRIPTED), Pieces(text),
                                      secrets=Secrets({"API_KEY": secret}))
            sent: list[dict[str, Any]] = []
            call = port.admit("c", InferenceRequest(featureSet="think", messages=MESSAGES, stream=True))
            if refused:
                with pytest.raises(InferenceRefused) as caught:
                    await call.run(request_id=1, send_chunk=sent_to(sent))
                assert caught.value.reason == "secret"
                streamed = "".join(c["delta"] for c in sent)
                assert streamed and ("a" * 45).startswith(streamed)  # what came before it, never the value
            else:
                result = await call.run(request_id=1, send_chunk=sent_to(sent))
                assert "".join(c["delta"] for c in sent) == result["content"] == text.replace("|", "")
            assert all(len(c["delta"]) <= 10 for c in sent)
            assert [c["index"] for c in sent] == list(range(len(sent)))

    def test_the_hosts_token_bound_caps_the_connectors_preference(self) -> None:
        """preferences.maxTokens below the backend's bound is used; above it, the bound wins."""
        config = InferenceConfig(backend=BackendConfig(kind="scripted", max_tokens=100))
        low = model_request(InferenceRequest(featureSet="t", messages=MESSAGES, preferences={"maxTokens": 10}), config)
        high = model_request(InferenceRequest(featureSet="t", messages=MESSAGES, preferences={"maxTokens": 10**6}),
                             config)
        assert (low.max_tokens, high.max_tokens) == (10, 100)
        assert low.system == "be brief" and [m.role for m in low.messages] == ["user"]


def sent_to(chunks: list[dict[str, Any]]) -> Any:
    """A SendChunk that appends each chunk's params to `chunks`."""
    async def send(chunk: dict[str, Any]) -> None:
        chunks.append(chunk)
    return send


def raw_requests(ids: list[Any], **params: Any) -> dict[str, Any]:
    """One `raw` step: every request in a single write, so the host reads them in one chunk."""
    import json

    body = {"featureSet": "think", "stream": False, "messages": MESSAGES, **params}
    return {"raw": "\n".join(json.dumps({"jsonrpc": "2.0", "id": i, "method": "inference/request", "params": body})
                             for i in ids)}


def answers_to(rec: Any, ids: list[Any]) -> dict[Any, dict[str, Any]]:
    return {m["id"]: m for m in rec.received if "method" not in m and m.get("id") in ids}


def cancel(request_id: Any) -> dict[str, Any]:
    return {"notify": "notifications/cancelled", "params": {"requestId": request_id, "reason": "user left"}}


class TestBurstsAndCancellation:
    async def test_a_burst_in_one_write_reaches_the_model_only_up_to_the_bound(self, tmp_path) -> None:
        """8 requests in one write: exactly MAX_CONCURRENT_PER_CONNECTOR reach the backend; the rest are busy."""
        ids = [f"r{i}" for i in range(2 * MAX_CONCURRENT_PER_CONNECTOR)]
        llm = LlmServer(default=Reply(hang=True)).start()
        try:
            spec = connector(tmp_path, "burst", [raw_requests(ids)])
            backend = BackendConfig(kind="openai", model="m", base_url=llm.openai_base_url, timeout_s=30)
            async with memory_host(with_inference(config_with(tmp_path, spec), backend)):
                busy = await wait_for(lambda: [a for a in answers_to(record(tmp_path, "burst"), ids).values()
                                               if a.get("error", {}).get("data", {}).get("reason") == "busy"]
                                      if len(answers_to(record(tmp_path, "burst"), ids)) >= 4 else None)
                await wait_for(lambda: len(llm.requests) >= MAX_CONCURRENT_PER_CONNECTOR)
                assert len(busy) == MAX_CONCURRENT_PER_CONNECTOR
                assert all(a["error"]["code"] == -32603 for a in busy)
                reached = len(llm.requests)
                llm.close()  # the held requests fail now, so the stop need not wait for them
                llm = None
        finally:
            if llm is not None:
                llm.close()
        assert reached == MAX_CONCURRENT_PER_CONNECTOR

    async def test_a_connector_cancels_its_own_request_and_not_another_connectors(self, tmp_path) -> None:
        """notifications/cancelled ends the named request's work with no answer, for its own connector only.

        Both connectors use the same request id, and both requests are at
        the model. After A cancels it, B's request still runs (its place is
        held), and B's own cancel still finds it.
        """
        from structlog.testing import capture_logs

        llm = LlmServer(default=Reply(hang=True)).start()
        try:
            steps = [raw_requests(["x"]), {"wait": "test/go"}, cancel("x")]  # test/go: sent by this test
            first, second = connector(tmp_path, "a", steps), connector(tmp_path, "b", steps)
            backend = BackendConfig(kind="openai", model="m", base_url=llm.openai_base_url, timeout_s=30)
            with capture_logs() as logs:
                async with memory_host(with_inference(config_with(tmp_path, first, second), backend)) as host:
                    def cancelled_in(name: str) -> list[Any]:
                        return [e for e in logs if e["event"] == "mcpl.request_cancelled"
                                and e.get("connector") == name]

                    def running() -> dict[str, int]:
                        return host.inference.statistics()["running"]

                    await wait_for(lambda: len(llm.requests) == 2)
                    await host.connectors["a"].notify("test/go")
                    await wait_for(lambda: cancelled_in("a"))
                    await wait_for(lambda: running() == {"b": 1})  # A's place is back, B's held
                    assert not cancelled_in("b")
                    await host.connectors["b"].notify("test/go")
                    await wait_for(lambda: cancelled_in("b"))
                    await wait_for(lambda: running() == {})
                    assert len(llm.requests) == 2
                    llm.close()
                    llm = None
        finally:
            if llm is not None:
                llm.close()
        for name in ("a", "b"):
            assert "x" not in answers_to(record(tmp_path, name), ["x"]), name  # a cancelled request is not answered
