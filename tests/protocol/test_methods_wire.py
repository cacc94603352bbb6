"""Every inbound request is answered once, refusals are error objects, denied means -32002 (SPEC §6.6, §14.1).

docs/connectors.md §1 and §8, and docs/mcpl-checklist.md items 8, 14, 15 and 16. The error
codes of docs/connectors.md §8 and where this suite produces each one:

    -32001  test_push_wire (disabled set, declaration mismatch), here (shape)
    -32002  here (every gated method), test_policy_wire (policy_pending, mcp_only)
    -32003  test_push_wire (undeclared set), here (shape)
    -32005  never: it is the server's answer to state/rollback, which this
            host does not send (SPEC §8: state is not built)
    -32017  test_channels_wire (incoming on an outbound-only channel)
    -32023  test_channels_wire (incoming on an unregistered channel)
    -32024  test_channels_wire (the connector's answer to channels/open, logged)
    -32600  test_robustness_wire (a request with a null or non-2.0 id)
    -32601  here (unknown, removed and deferred methods)
    -32602  test_push_wire, here (malformed params)
    -32603  here (a failure inside the host while storing)
    -32700  never sent: a line that is not JSON is logged and skipped
            (test_robustness_wire asserts that no reply goes out)
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from structlog.testing import capture_logs

from mcplhost.config import FeatureSetSelection

from ..builders import incoming, push, register
from ..harness import (
    CHAT_MANIFEST,
    SPLIT_MANIFEST,
    config_with,
    error_of,
    logged,
    nudge,
    record,
    result_of,
    scripted,
    wait_for,
)
from ..memory_pair import memory_connected, memory_host

#: Advertises all 17 paths (tools via MCP capabilities), with feature sets for pushes.
FULL_MANIFEST: dict[str, Any] = {
    "version": "0.5", "pushEvents": True, "modelInfo": True, "inferenceLifecycle": True, "inferenceRequest": True,
    "contextHooks": True, "channels": True,
    "featureSets": {**SPLIT_MANIFEST["featureSets"], "off": {"description": "off", "uses": ["pushEvents"]}},
}
INFERENCE = {"featureSet": "alerts", "messages": [{"role": "user", "content": "hi"}]}
DOCUMENTED = {-32001, -32002, -32003, -32017, -32023, -32600, -32601, -32602, -32603}


def replies_by_id(rec: Any) -> Counter[str]:
    """How many replies the connector received for each of its request ids."""
    return Counter(json.dumps(m["id"]) for m in rec.received if "id" in m and "method" not in m)


class TestEveryRequestIsAnswered:
    async def test_each_request_gets_exactly_one_answer_whatever_its_method(self, tmp_path) -> None:
        """Known, gated, unknown, removed, deferred and notification-only methods each get one reply."""
        calls = [["ping", {}], ["model/info", {}], ["channels/list", {}], ["host/command", {"command": "status"}],
                 ["featureSets/changed", {}], ["scope/elevate", {"capabilities": ["modelInfo"]}],
                 ["context/afterInference", {}], ["channels/acknowledge", {}], ["channels/typing", {}],
                 ["state/rollback", {"featureSet": "alerts", "checkpoint": "c"}], ["inference/request", INFERENCE],
                 ["mcpl/manifestChanged", {"revision": "sha256:" + "A" * 43, "domains": ["capabilities"]}],
                 ["notifications/initialized", {}], ["featureSets/update", {"effectiveCapabilities": ["*"]}]]
        removed_notifications = [{"notify": m, "params": {}} for m in ("featureSets/changed", "scope/elevate")]
        script = {"manifest": FULL_MANIFEST, "tools": True,
                  "steps": [*removed_notifications, {"requests": calls}, {"request": "ping"}]}
        spec = scripted("every", script, tmp_path, grant=["modelInfo", "channels.register"])
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "every").done)
        rec = record(tmp_path, "every")
        sent = [m["id"] for m in rec.sent if "method" in m and "id" in m]
        assert len(sent) == len(calls) + 1
        counts = replies_by_id(rec)
        assert {json.dumps(i): counts[json.dumps(i)] for i in sent} == {json.dumps(i): 1 for i in sent}
        answers = {e["item"]: e for e in rec.events if e["kind"] == "answer" and e["step"] == 2}
        codes = {calls[i][0]: (a.get("error") or {}).get("code", "result") for i, a in answers.items()}
        assert codes == {
            "ping": "result", "model/info": -32002, "channels/list": "result", "host/command": -32601,
            "featureSets/changed": -32601, "scope/elevate": -32601, "context/afterInference": -32601,
            "channels/acknowledge": -32601, "channels/typing": -32601, "state/rollback": -32601,
            "inference/request": -32002, "mcpl/manifestChanged": -32601, "notifications/initialized": -32601,
            "featureSets/update": -32601}
        assert answers[2]["result"] == {"channels": []}


class TestDeniedCapability:
    async def test_every_gated_method_without_its_capability_gets_minus_32002_naming_it(self, tmp_path) -> None:
        """With an empty grant each privileged method is refused -32002 {capability} and nothing gated is sent."""
        calls = [("push/event", push(feature_set="alerts"), "pushEvents"),
                 ("inference/request", INFERENCE, "inferenceRequest"),
                 ("inference/request", {**INFERENCE, "stream": True}, "inferenceRequest"),
                 ("model/info", {}, "modelInfo"),
                 ("channels/register", {"channels": []}, "channels.register"),
                 ("channels/changed", {"added": []}, "channels.register"),
                 ("channels/list", {}, "channels.register"),
                 ("channels/incoming", {"messages": []}, "channels.incoming")]
        steps = [{"request": method, "params": params} for method, params, _ in calls]
        spec = scripted("denied", {"manifest": FULL_MANIFEST, "tools": True, "steps": steps}, tmp_path, grant=[])
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "denied").done)
        rec = record(tmp_path, "denied")
        for step, (method, _, capability) in enumerate(calls):
            assert error_of(rec, step) == {"code": -32002, "message": "Capability denied",
                                           "data": {"capability": capability}}, method
        assert rec.methods_received() == ["initialize", "notifications/initialized", "featureSets/update"]

    async def test_configured_but_unbuilt_methods_are_not_granted_and_refused_as_such(self, tmp_path) -> None:
        """model/info and inference/request configured in the grant are not granted (not implemented): -32002."""
        steps = [{"request": "model/info"}, {"request": "inference/request", "params": INFERENCE}]
        spec = scripted("unbuilt", {"manifest": FULL_MANIFEST, "steps": steps}, tmp_path,
                        grant=["modelInfo", "inferenceRequest"])
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "unbuilt").done)
        rec = record(tmp_path, "unbuilt")
        assert error_of(rec, 0)["data"] == {"capability": "modelInfo"}
        assert error_of(rec, 1)["data"] == {"capability": "inferenceRequest"}
        (policy,) = [m for m in rec.received if m.get("method") == "featureSets/update"]
        assert policy["params"]["effectiveCapabilities"] == []
        assert logged(logs, "connector.grant_unimplemented", connector="unbuilt",
                      paths=["inferenceRequest", "modelInfo"])


class TestRefusalShape:
    async def test_refusals_are_error_objects_with_documented_codes_and_no_hints(self, tmp_path) -> None:
        """No refusal is a result with accepted:false, and -32001 carries only {featureSet}: never canEnable."""
        steps = [{"request": "push/event", "params": push("e-1", feature_set="off")},
                 {"request": "push/event", "params": push("e-2", feature_set="nope")},
                 {"request": "push/event", "params": {"featureSet": "alerts"}},
                 {"request": "model/info"},
                 {"request": "nope/nope"},
                 register("d:1"),
                 incoming({"channelId": "d:2", "messageId": "m-1", "content": [{"type": "text", "text": "x"}]})]
        spec = scripted("shape", {"manifest": FULL_MANIFEST, "steps": steps}, tmp_path,
                        grant=["pushEvents", "channels.register", "channels.incoming"],
                        feature_sets=FeatureSetSelection(disabled=["off"]))
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "shape").done)
        rec = record(tmp_path, "shape")
        codes = [error_of(rec, step)["code"] for step in range(5)]
        assert codes == [-32001, -32003, -32602, -32002, -32601]
        assert set(codes) <= DOCUMENTED
        assert error_of(rec, 0)["data"] == {"featureSet": "off"}
        replies = [m for m in rec.received if "id" in m and "method" not in m]
        assert not any(r.get("result", {}).get("accepted") is False for r in replies)
        assert "canEnable" not in json.dumps(replies)
        assert result_of(rec, 6)["results"][0]["code"] == -32023


class BrokenIntake:
    """An intake whose store fails: the host's own failure while storing."""

    def content_problem(self, blocks: list[dict[str, Any]]) -> str | None:
        return None

    async def store_messages(self, server_id: str, lane: str, messages: list[Any]) -> list[dict[str, Any]]:
        raise RuntimeError("the disk is on fire")

    async def store_push(self, server_id: str, push: Any) -> Any:
        raise RuntimeError("the disk is on fire")


class TestInternalError:
    async def test_a_failure_inside_the_host_is_answered_minus_32603_and_the_connection_goes_on(self, tmp_path) -> None:
        """A store that raises gives -32603 without internals, and the next request is served."""
        steps = [{"request": "push/event", "params": push(feature_set="alerts")}, register("d:1"),
                 incoming({"channelId": "d:1", "messageId": "m-1", "content": [{"type": "text", "text": "x"}]}),
                 {"wait": "test/go"}, {"request": "ping"}]
        spec = scripted("broken", {"manifest": SPLIT_MANIFEST, "steps": steps}, tmp_path,
                        grant=["pushEvents", "channels.register", "channels.incoming"])
        async with memory_connected(spec, tmp_path, intake=BrokenIntake()) as connection:
            await wait_for(lambda: 2 in record(tmp_path, "broken").answers())
            await nudge(connection, "test/go")
            await wait_for(lambda: record(tmp_path, "broken").done)
        rec = record(tmp_path, "broken")
        for step in (0, 2):
            assert error_of(rec, step) == {"code": -32603, "message": "internal error",
                                           "data": {"type": "RuntimeError"}}
        assert "fire" not in json.dumps(rec.received)
        assert result_of(rec, 4) == {}


class TestMcpOnly:
    async def test_a_server_without_a_manifest_is_mcp_only_and_gets_no_policy(self, tmp_path) -> None:
        """No experimental.mcpl: no featureSets/update is sent and privileged methods get -32002 mcp_only."""
        spec = scripted("plain", {"manifest": None, "tools": True, "after": "initialized",
                                  "steps": [{"request": "ping"}, register("d:1")]},
                        tmp_path, grant=["channels.register"])
        unversioned = scripted("unversioned", {"manifest": {k: v for k, v in CHAT_MANIFEST.items() if k != "version"},
                                               "after": "initialized", "steps": [{"request": "ping"}, register("d:1")]},
                               tmp_path, grant=["channels.register"])
        async with memory_host(config_with(tmp_path, spec, unversioned)):
            await wait_for(lambda: record(tmp_path, "plain").done and record(tmp_path, "unversioned").done)
        for name in ("plain", "unversioned"):
            rec = record(tmp_path, name)
            assert "featureSets/update" not in rec.methods_received(), name
            assert error_of(rec, 1)["data"] == {"capability": "channels.register", "reason": "mcp_only"}, name
