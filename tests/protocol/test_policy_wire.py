"""The initial policy, the effective grant and every way the receipt can go, on the wire.

SPEC §5.3, §5.4 and §6.7, through the host's real connection against the
scripted connector in memory (tests/memory_pair.py) and a real store. Grant
changes after the handshake are driven through `McplConnection.send_policy`
(`harness.change_grant`) on a connection built directly against it
(`memory_connected`).
"""

from __future__ import annotations

from typing import Any

import anyio
from structlog.testing import capture_logs

from mcplhost.protocol.connection import Mode
from mcplhost.protocol.vocabulary import INJECT_SYSTEM

from ..builders import push, register
from ..harness import (
    CHAT_MANIFEST,
    SPLIT_MANIFEST,
    change_grant,
    config_with,
    error_of,
    logged,
    nudge,
    received,
    record,
    result_of,
    scripted,
    wait_for,
)
from ..memory_pair import memory_connected, memory_host

#: Advertises all 17 vocabulary paths (with `tools` from MCP's capabilities).
FULL_MANIFEST: dict[str, Any] = {
    "version": "0.5",
    "pushEvents": True,
    "modelInfo": True,
    "inferenceLifecycle": True,
    "inferenceRequest": True,
    "contextHooks": True,
    "channels": True,
    "featureSets": CHAT_MANIFEST["featureSets"],
}

ACCEPTED = {"result": {"accepted": True}}


def policies(name: str, folder: Any) -> list[dict[str, Any]]:
    """Every featureSets/update the connector received, in order."""
    return received(folder, name, "featureSets/update")


def configured(name: str, folder: Any, logs: list[dict[str, Any]]) -> list[str]:
    """What the SPEC §5.4 rule granted `name`: the grant sent, plus the paths dropped as not implemented (logged)."""
    sent = policies(name, folder)[0]["params"]["effectiveCapabilities"]
    dropped = [path for e in logged(logs, "connector.grant_unimplemented", connector=name) for path in e["paths"]]
    return sorted(sent + dropped)


def denied(error: dict[str, Any], capability: str, reason: str | None = None) -> bool:
    """Whether `error` is -32002 for `capability` (with `reason`, or with no reason at all)."""
    expected = {"capability": capability} if reason is None else {"capability": capability, "reason": reason}
    return error["code"] == -32002 and error.get("data") == expected


class TestInitialPolicy:
    async def test_the_policy_is_a_request_sent_right_after_initialized_even_for_an_empty_grant(self, tmp_path) -> None:
        """With nothing granted the host still sends featureSets/update as a Request with an empty allowlist."""
        spec = scripted("empty", {"manifest": CHAT_MANIFEST, "steps": [{"request": "ping"}]}, tmp_path, grant=[])
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "empty").done)
        rec = record(tmp_path, "empty")
        assert rec.methods_received()[:3] == ["initialize", "notifications/initialized", "featureSets/update"]
        (policy,) = policies("empty", tmp_path)
        assert "id" in policy
        assert policy["params"]["effectiveCapabilities"] == []
        assert set(policy["params"]["deniedCapabilities"]) == {"channels.register", "channels.incoming",
                                                               "channels.publish", "channels.lifecycle", "pushEvents"}

    async def test_every_privileged_method_is_refused_with_policy_pending_until_the_receipt(self, tmp_path) -> None:
        """Before the receipt each privileged method gets -32002 {capability, reason: "policy_pending"}, not a wait."""
        calls = [
            ["push/event", push()],
            ["inference/request", {"featureSet": "chat", "messages": [{"role": "user", "content": "hi"}]}],
            ["model/info", {}],
            ["channels/register", {"channels": []}],
            ["channels/changed", {"added": []}],
            ["channels/list", {}],
            ["channels/incoming", {"messages": []}],
        ]
        script = {"manifest": FULL_MANIFEST, "tools": True, "policy": {"delay": 1.5, **ACCEPTED},
                  "after": "initialized", "steps": [{"requests": calls}]}
        spec = scripted("early", script, tmp_path, grant=["*", "channels.*"])
        async with memory_host(config_with(tmp_path, spec), wait_ready=False):
            await wait_for(lambda: record(tmp_path, "early").done)
        rec = record(tmp_path, "early")
        answers = {e["item"]: e for e in rec.events if e["kind"] == "answer"}
        needs = ["pushEvents", "inferenceRequest", "modelInfo", "channels.register", "channels.register",
                 "channels.register", "channels.incoming"]
        for item, capability in enumerate(needs):
            assert "result" not in answers[item], (calls[item][0], answers[item])
            assert denied(answers[item]["error"], capability, "policy_pending"), (calls[item][0], answers[item])

    async def test_a_notification_never_makes_the_connection_ready(self, tmp_path) -> None:
        """Receipt-shaped notifications and id-less responses leave the policy pending until it times out."""
        script = {
            "manifest": CHAT_MANIFEST, "policy": "ignore", "after": "initialized",
            "steps": [
                {"notify": "featureSets/update", "params": {"accepted": True}},
                {"raw": '{"jsonrpc":"2.0","result":{"accepted":true}}'},
                {"raw": '{"jsonrpc":"2.0","id":null,"result":{"accepted":true}}'},
                {"raw": '{"jsonrpc":"2.0","id":999,"result":{"accepted":true}}'},
                {"request": "push/event", "params": push()},
            ],
        }
        spec = scripted("notif", script, tmp_path, grant=["pushEvents"], policy_timeout_s=1.0)
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "notif").done)
        assert denied(error_of(record(tmp_path, "notif"), 4), "pushEvents", "policy_pending")
        assert not logged(logs, "connector.ready")
        assert logged(logs, "connector.mcp_only", reason="no answer to the policy")


class TestEffectiveCapabilities:
    async def test_only_advertised_understood_and_allowed_paths_are_granted(self, tmp_path) -> None:
        """effectiveCapabilities is advertised ∩ policy, sorted, and never shares a path with deniedCapabilities."""
        manifest = {"version": "0.5", "pushEvents": True, "modelInfo": True, "x-vendor": {"magic": True},
                    "channels": {"register": True, "incoming": True}, "featureSets": CHAT_MANIFEST["featureSets"]}
        grant = ["pushEvents", "modelInfo", "tools", "channels.publish", "inferenceRequest", "x-vendor.magic"]
        spec = scripted("caps", {"manifest": manifest, "tools": True,
                                 "steps": [register("disc:g1:room")]}, tmp_path, grant=grant)
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "caps").done)
        (policy,) = policies("caps", tmp_path)
        granted, refused = policy["params"]["effectiveCapabilities"], policy["params"]["deniedCapabilities"]
        assert configured("caps", tmp_path, logs) == ["modelInfo", "pushEvents", "tools"]
        # Only what this host implements goes out; the rest is denied and logged once (docs/grants.md#the-grant-of-one-connection).
        assert granted == ["pushEvents", "tools"]
        assert refused == ["channels.incoming", "channels.register", "modelInfo"]
        assert logged(logs, "connector.grant_unimplemented", connector="caps", paths=["modelInfo"])
        assert not set(granted) & set(refused)
        # Advertised but not allowed is not granted.
        assert denied(error_of(record(tmp_path, "caps"), 0), "channels.register")

    async def test_wildcards_match_exactly_one_segment_and_inject_system_only_by_name(self, tmp_path) -> None:
        """`*` is one segment at equal depth, a bare parent grants nothing, and inject.system needs its literal name."""
        grants = {
            "star": ["*", "channels.*", "contextHooks.*", "channels", "contextHooks"],
            "inject": ["contextHooks.beforeInference.inject.*", "contextHooks.beforeInference.*",
                       "*.*.*.*", "contextHooks.*.inject.*"],
            "system": [INJECT_SYSTEM],
        }
        specs = [scripted(name, {"manifest": FULL_MANIFEST, "tools": True}, tmp_path, grant=grant)
                 for name, grant in grants.items()]
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, *specs)):
                await wait_for(lambda: all(policies(name, tmp_path) for name in grants))
        effective = {name: configured(name, tmp_path, logs) for name in grants}
        assert effective["star"] == [
            "channels.acknowledge", "channels.incoming", "channels.lifecycle", "channels.publish",
            "channels.register", "channels.streaming", "channels.typing",
            "inferenceLifecycle", "inferenceRequest", "modelInfo", "pushEvents", "tools"]
        assert effective["inject"] == [
            "contextHooks.beforeInference.inject.afterUser", "contextHooks.beforeInference.inject.beforeUser",
            "contextHooks.beforeInference.observe"]
        assert INJECT_SYSTEM in policies("inject", tmp_path)[0]["params"]["deniedCapabilities"]
        assert effective["system"] == [INJECT_SYSTEM]
        # What goes out is only what this host implements.
        assert policies("star", tmp_path)[0]["params"]["effectiveCapabilities"] == [
            "channels.acknowledge", "channels.incoming", "channels.lifecycle", "channels.publish", "channels.register",
            "channels.streaming", "channels.typing", "inferenceLifecycle", "pushEvents", "tools"]
        assert policies("inject", tmp_path)[0]["params"]["effectiveCapabilities"] == effective["inject"]
        assert policies("system", tmp_path)[0]["params"]["effectiveCapabilities"] == [INJECT_SYSTEM]

    async def test_a_nested_advertisement_is_walked_recursively(self, tmp_path) -> None:
        """Deep object nodes advertise their leaves, an object node counts at its own path, false grants nothing."""
        manifest = {"version": "0.5",
                    "contextHooks": {"beforeInference": {"inject": {"afterUser": True, "system": False},
                                                         "observe": False}},
                    "inferenceRequest": {"streaming": False},
                    "channels": {"register": {"anything": True}}}
        spec = scripted("deep", {"manifest": manifest}, tmp_path, grant=["*", "*.*", "*.*.*", "*.*.*.*"])
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: policies("deep", tmp_path))
        assert configured("deep", tmp_path, logs) == [
            "channels.register", "contextHooks.beforeInference.inject.afterUser", "inferenceRequest"]


class TestReceiptOutcomes:
    async def test_method_not_found_to_the_initial_policy_means_a_legacy_server_that_is_ready(self, tmp_path) -> None:
        """-32601 to the first featureSets/update is "policy acknowledged": ready with the host's grant."""
        script = {"manifest": CHAT_MANIFEST, "policy": {"error": {"code": -32601, "message": "Method not found"}},
                  "steps": [{"request": "push/event", "params": push()}]}
        spec = scripted("legacy", script, tmp_path, grant=["pushEvents"])
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "legacy").done)
        assert result_of(record(tmp_path, "legacy"), 0) == {"accepted": True}
        assert logged(logs, "connector.legacy_policy")
        assert logged(logs, "connector.up", mode="ready")

    async def test_method_not_found_under_protocol_0_5_is_not_ready(self, tmp_path) -> None:
        """With `protocol = "0.5"` a -32601 to the policy is a failure: the connection falls back to MCP-only."""
        script = {"manifest": CHAT_MANIFEST, "policy": {"error": {"code": -32601, "message": "Method not found"}},
                  "steps": [{"request": "push/event", "params": push()}]}
        spec = scripted("strict", script, tmp_path, grant=["pushEvents"], protocol="0.5")
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "strict").done)
        assert denied(error_of(record(tmp_path, "strict"), 0), "pushEvents", "mcp_only")
        assert logged(logs, "connector.up", mode="mcp_only")

    async def test_a_refusal_with_fallback_mcp_only_turns_mcpl_off_and_is_never_retried_wider(self, tmp_path) -> None:
        """accepted:false + fallback "mcp-only": MCPL is off, and the host does not answer with a wider grant."""
        refusal = {"result": {"accepted": False, "fallback": "mcp-only", "reason": "need more",
                              "missingCapabilities": ["channels.register", "modelInfo"]}}
        script = {"manifest": FULL_MANIFEST, "policy": refusal,
                  "steps": [{"request": "push/event", "params": push()}, {"request": "channels/list"}]}
        spec = scripted("refuse", script, tmp_path, grant=["pushEvents"])
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "refuse").done)
        rec = record(tmp_path, "refuse")
        assert denied(error_of(rec, 0), "pushEvents", "mcp_only")
        assert denied(error_of(rec, 1), "channels.register", "mcp_only")
        assert len(policies("refuse", tmp_path)) == 1

    async def test_a_refusal_with_fallback_close_stops_the_connector(self, tmp_path) -> None:
        """accepted:false + fallback "close": the host closes the connection and does not restart it."""
        refusal = {"result": {"accepted": False, "fallback": "close"}}
        spec = scripted("closing", {"manifest": CHAT_MANIFEST, "policy": refusal}, tmp_path, grant=["pushEvents"])
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: logged(logs, "connector.stopped"))
        assert logged(logs, "connector.policy_closed", reason="policy refused")
        assert logged(logs, "connector.exited", ended="policy_closed")
        assert not logged(logs, "connector.ready")

    async def test_a_refusal_without_fallback_applies_the_operators_fallback_and_logs_a_defect(self, tmp_path) -> None:
        """accepted:false with no valid fallback is a defect; the configured policy_fallback decides."""
        spec = scripted("nofall", {"manifest": CHAT_MANIFEST, "policy": {"result": {"accepted": False}}},
                        tmp_path, grant=["pushEvents"], policy_fallback="close")
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: logged(logs, "connector.stopped"))
        assert logged(logs, "connector.defect", defect="refusal without a valid fallback")
        assert logged(logs, "connector.exited", ended="policy_closed")

    async def test_no_answer_times_out_into_the_fallback_and_a_late_receipt_changes_nothing(self, tmp_path) -> None:
        """A receipt after policy_timeout_s never makes the connection ready: MCP-only stays."""
        script = {"manifest": CHAT_MANIFEST, "policy": {"delay": 1.0, **ACCEPTED},
                  "steps": [{"request": "push/event", "params": push()}]}
        spec = scripted("slow", script, tmp_path, grant=["pushEvents"], policy_timeout_s=0.3)
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "slow").done)
        # The connector sent its push only after its (late) receipt went out.
        assert denied(error_of(record(tmp_path, "slow"), 0), "pushEvents", "mcp_only")
        assert logged(logs, "connector.mcp_only", reason="no answer to the policy")
        assert not logged(logs, "connector.ready")

    async def test_a_json_rpc_error_or_an_unusable_receipt_is_not_ready(self, tmp_path) -> None:
        """An error other than -32601, or a result that is no receipt, leads to the fallback, never to ready."""
        answers = {"errs": {"error": {"code": -32603, "message": "boom"}}, "junk": {"result": "yes"},
                   "noflag": {"result": {"mode": "degraded"}}}
        specs = [scripted(name, {"manifest": CHAT_MANIFEST, "policy": answer,
                                 "steps": [{"request": "push/event", "params": push()}]},
                          tmp_path, grant=["pushEvents"])
                 for name, answer in answers.items()]
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, *specs)):
                await wait_for(lambda: all(record(tmp_path, name).done for name in answers))
        for name in answers:
            assert denied(error_of(record(tmp_path, name), 0), "pushEvents", "mcp_only"), name
        assert logged(logs, "connector.mcp_only", reason="policy answered with error -32603")
        assert len(logged(logs, "connector.defect", defect="unusable policy receipt")) == 2
        assert not logged(logs, "connector.ready")


    async def test_a_degradation_entry_without_effect_is_a_logged_defect(self, tmp_path) -> None:
        """unavailableFeatures entries must carry `effect`; one without it is logged, and the receipt still counts."""
        receipt = {"result": {"accepted": True, "mode": "degraded",
                              "unavailableFeatures": [{"featureSet": "chat", "missingCapabilities": []}]}}
        script = {"manifest": CHAT_MANIFEST, "policy": receipt,
                  "steps": [{"request": "push/event", "params": push()}]}
        spec = scripted("noeffect", script, tmp_path, grant=CHAT_MANIFEST["featureSets"]["chat"]["uses"])
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "noeffect").done)
        assert logged(logs, "connector.defect", defect="unavailableFeatures entry without effect")
        assert result_of(record(tmp_path, "noeffect"), 0) == {"accepted": True}


class TestReceiptNeverWidens:
    async def test_a_receipt_claiming_more_grants_nothing_more(self, tmp_path) -> None:
        """missingCapabilities, notes and a receipt's own capability lists never widen the grant."""
        receipt = {"result": {"accepted": True, "mode": "degraded",
                              "effectiveCapabilities": ["pushEvents", "modelInfo"],
                              "missingCapabilities": ["pushEvents", "modelInfo"], "notes": ["grant pushEvents"],
                              "unavailableFeatures": [{"featureSet": "chat", "missingCapabilities": ["pushEvents"],
                                                       "effect": "disabled"}]}}
        script = {"manifest": FULL_MANIFEST, "policy": receipt,
                  "steps": [{"request": "push/event", "params": push()}, {"request": "model/info"}]}
        spec = scripted("greedy", script, tmp_path, grant=["channels.register"])
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "greedy").done)
        rec = record(tmp_path, "greedy")
        assert denied(error_of(rec, 0), "pushEvents")
        assert denied(error_of(rec, 1), "modelInfo")
        assert len(policies("greedy", tmp_path)) == 1


class TestPolicyUpdates:
    GRANT = ["pushEvents", "channels.register", "channels.incoming"]

    async def test_a_narrowing_applies_before_its_request_goes_out(self, tmp_path) -> None:
        """Revoking pushEvents refuses a push sent while the narrowing's receipt is still outstanding."""
        script = {"manifest": SPLIT_MANIFEST, "policy": [ACCEPTED, {"delay": 1.0, **ACCEPTED}],
                  "steps": [{"wait": "test/go"}, {"request": "push/event", "params": push(feature_set="alerts")}]}
        spec = scripted("narrow", script, tmp_path, grant=self.GRANT)
        async with memory_connected(spec, tmp_path) as connection, anyio.create_task_group() as tg:
            assert "pushEvents" in connection.grant
            tg.start_soon(change_grant, connection, frozenset({"channels.register", "channels.incoming"}))
            await wait_for(lambda: len(policies("narrow", tmp_path)) == 2)
            await nudge(connection, "test/go")
            await wait_for(lambda: record(tmp_path, "narrow").done)
            assert connection.mode is Mode.READY
        assert denied(error_of(record(tmp_path, "narrow"), 1), "pushEvents")
        assert all("id" in p for p in policies("narrow", tmp_path))
        assert policies("narrow", tmp_path)[1]["params"]["effectiveCapabilities"] == ["channels.incoming",
                                                                                     "channels.register"]

    async def test_a_mixed_change_revokes_at_once_and_widens_only_at_the_receipt(self, tmp_path) -> None:
        """Swapping pushEvents for channels.incoming: pushes are refused at once, incoming works after the receipt."""
        script = {"manifest": SPLIT_MANIFEST, "policy": [ACCEPTED, {"delay": 2.0, **ACCEPTED}],
                  "steps": [register("disc:g1:room"), {"wait": "test/go"},
                            {"request": "push/event", "params": push(feature_set="alerts")},
                            {"request": "channels/incoming", "params": {"messages": []}},
                            {"wait": "test/again"},
                            {"request": "channels/incoming", "params": {"messages": []}}]}
        spec = scripted("mixed", script, tmp_path, grant=["pushEvents", "channels.register"])
        async with memory_connected(spec, tmp_path) as connection:
            async with anyio.create_task_group() as tg:
                tg.start_soon(change_grant, connection, frozenset({"channels.register", "channels.incoming"}))
                await wait_for(lambda: len(policies("mixed", tmp_path)) == 2)
                await nudge(connection, "test/go")
                await wait_for(lambda: 3 in record(tmp_path, "mixed").answers())
            await nudge(connection, "test/again")  # the update has returned: its receipt is applied
            await wait_for(lambda: record(tmp_path, "mixed").done)
        rec = record(tmp_path, "mixed")
        assert denied(error_of(rec, 2), "pushEvents")
        assert denied(error_of(rec, 3), "channels.incoming")
        assert result_of(rec, 5) == {"results": []}

    async def test_a_widening_that_is_never_answered_never_takes_effect(self, tmp_path) -> None:
        """An unanswered widening times out into the fallback; the new path is refused before and after."""
        script = {"manifest": SPLIT_MANIFEST, "policy": [ACCEPTED, "ignore"],
                  "steps": [{"wait": "test/go"}, {"request": "push/event", "params": push(feature_set="alerts")},
                            {"wait": "test/again"},
                            {"request": "push/event", "params": push("e-2", feature_set="alerts")}]}
        spec = scripted("never", script, tmp_path, grant=["channels.register"], policy_timeout_s=1.0)
        async with memory_connected(spec, tmp_path) as connection:
            async with anyio.create_task_group() as tg:
                tg.start_soon(change_grant, connection, frozenset({"channels.register", "pushEvents"}))
                await wait_for(lambda: len(policies("never", tmp_path)) == 2)
                await nudge(connection, "test/go")
                await wait_for(lambda: 1 in record(tmp_path, "never").answers())
            assert "pushEvents" not in connection.grant
            await nudge(connection, "test/again")
            await wait_for(lambda: record(tmp_path, "never").done)
        rec = record(tmp_path, "never")
        assert denied(error_of(rec, 1), "pushEvents")
        assert error_of(rec, 3)["code"] == -32002

    async def test_a_stale_receipt_never_undoes_a_later_revocation(self, tmp_path) -> None:
        """When a widening's receipt arrives after a narrowing was sent, what the narrowing dropped stays dropped."""
        script = {"manifest": SPLIT_MANIFEST,
                  "policy": [ACCEPTED, {"delay": 0.5, **ACCEPTED}, {"delay": 1.5, **ACCEPTED}],
                  "steps": [{"wait": "featureSets/update", "count": 3}, {"wait": "test/go"},
                            {"request": "push/event", "params": push(feature_set="alerts")}]}
        spec = scripted("stale", script, tmp_path, grant=["channels.register"])
        async with memory_connected(spec, tmp_path) as connection, anyio.create_task_group() as tg:
            widened = anyio.Event()

            async def widen() -> None:
                await change_grant(connection, frozenset({"channels.register", "pushEvents"}))
                widened.set()

            tg.start_soon(widen)
            await wait_for(lambda: len(policies("stale", tmp_path)) == 2)
            tg.start_soon(change_grant, connection, frozenset({"channels.register"}))
            await widened.wait()  # the widening's receipt is in, the narrowing's is not
            assert "pushEvents" not in connection.grant
            await nudge(connection, "test/go")
            await wait_for(lambda: record(tmp_path, "stale").done)
        assert denied(error_of(record(tmp_path, "stale"), 2), "pushEvents")
