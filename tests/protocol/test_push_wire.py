"""push/event on the wire: admission order, feature sets, origin, dedup and the audit log.

SPEC §9 and §6. Every
connector here is the scripted connector in memory (tests/memory_pair.py);
answers are read from its record and stored items from the real SQLite file.
"""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from mcplhost.config import FeatureSetSelection

from ..builders import push, register, texts
from ..harness import SPLIT_MANIFEST, config_with, error_of, items_when, logged, record, result_of, scripted, wait_for
from ..memory_pair import memory_host

GRANT = ["pushEvents", "channels.register", "channels.incoming"]

#: Feature sets for every admission outcome: enabled, disabled by the operator, and
#: enabled without pushEvents in its `uses`.
ADMISSION_MANIFEST: dict[str, Any] = {
    **SPLIT_MANIFEST,
    "featureSets": {
        **SPLIT_MANIFEST["featureSets"],
        "off": {"description": "switched off by the operator", "uses": ["channels.register"]},
    },
}


def run(tmp_path, name: str, steps: list[dict[str, Any]], **fields: Any):
    return scripted(name, {"manifest": fields.pop("manifest", ADMISSION_MANIFEST), "steps": steps}, tmp_path,
                    grant=fields.pop("grant", GRANT), **fields)


def pushing(params: dict[str, Any]) -> dict[str, Any]:
    return {"request": "push/event", "params": params}


class TestAdmissionOrder:
    async def test_ready_then_grant_then_params_then_declared_then_enabled_then_uses(self, tmp_path) -> None:
        """Where several checks fail, the earliest in docs/connectors.md §8's order names the error."""
        bad_params = {"featureSet": "nope", "payload": {"content": []}}  # no eventId, no timestamp
        steps = [
            pushing(bad_params),                                         # 0 params before declared
            pushing(push(feature_set="nope")),                           # 1 undeclared
            pushing(push(feature_set="off")),                            # 2 disabled before uses
            pushing(push(feature_set="chat")),                           # 3 enabled, uses lacks pushEvents
            pushing(push(feature_set="nope", body="")),                  # 4 empty content is a params problem
            pushing(push(feature_set="")),                               # 5 an empty featureSet is invalid
            pushing({**push(feature_set="alerts"), "featureSet": 7}),    # 6 a mistyped featureSet
            pushing(push(feature_set="alerts")),                         # 7 admitted
        ]
        specs = [
            run(tmp_path, "order", steps, feature_sets=FeatureSetSelection(disabled=["off"])),
            run(tmp_path, "ungranted", [pushing(bad_params)], grant=["channels.register"]),
            scripted("pending", {"manifest": ADMISSION_MANIFEST, "after": "initialized",
                                 "policy": {"delay": 1.0, "result": {"accepted": True}},
                                 "steps": [pushing(bad_params)]}, tmp_path, grant=GRANT),
        ]
        async with memory_host(config_with(tmp_path, *specs), wait_ready=False):
            await wait_for(lambda: all(record(tmp_path, s.name).done for s in specs))
        rec = record(tmp_path, "order")
        assert error_of(rec, 0)["code"] == -32602
        assert error_of(rec, 1) == {"code": -32003, "message": "Unknown feature set", "data": {"featureSet": "nope"}}
        assert error_of(rec, 2) == {"code": -32001, "message": "Feature set not enabled", "data": {"featureSet": "off"}}
        assert error_of(rec, 3)["code"] == -32001
        assert error_of(rec, 3)["data"] == {"featureSet": "chat", "capability": "pushEvents",
                                            "reason": "declaration_mismatch"}
        assert error_of(rec, 4)["code"] == -32602
        assert error_of(rec, 5)["code"] == -32602
        assert error_of(rec, 6)["code"] == -32602
        assert result_of(rec, 7) == {"accepted": True}
        assert error_of(record(tmp_path, "ungranted"), 0)["data"] == {"capability": "pushEvents"}
        assert error_of(record(tmp_path, "pending"), 0)["data"] == {"capability": "pushEvents",
                                                                    "reason": "policy_pending"}
        assert len(await items_when(tmp_path, 1)) == 1

    async def test_a_declaration_mismatch_is_refused_and_recorded(self, tmp_path) -> None:
        """An enabled set pushing without pushEvents in its `uses` is refused although granted, and logged."""
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, run(tmp_path, "mismatch", [pushing(push())]))):
                await wait_for(lambda: record(tmp_path, "mismatch").done)
        assert error_of(record(tmp_path, "mismatch"), 0)["data"]["reason"] == "declaration_mismatch"
        assert logged(logs, "connector.declaration_mismatch", connector="mismatch", featureSet="chat",
                      capability="pushEvents")


class TestFeatureSetDerivation:
    async def test_invalid_uses_fails_closed(self, tmp_path) -> None:
        """`uses` absent, empty, not a list, unknown or a parent path disables the set as invalid_uses."""
        invalid = {"absent": {"description": "x"}, "empty": {"description": "x", "uses": []},
                   "string": {"description": "x", "uses": "pushEvents"},
                   "unknown": {"description": "x", "uses": ["pushEvents", "pushEvents.extra"]},
                   "parent": {"description": "x", "uses": ["pushEvents", "contextHooks.beforeInference"]}}
        manifest = {**SPLIT_MANIFEST, "contextHooks": True, "featureSets": {**SPLIT_MANIFEST["featureSets"], **invalid}}
        steps = [pushing(push(f"e-{name}", feature_set=name)) for name in invalid]
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, run(tmp_path, "fs", steps, manifest=manifest,
                                                              grant=[*GRANT, "contextHooks.*.*"]))):
                await wait_for(lambda: record(tmp_path, "fs").done)
        rec = record(tmp_path, "fs")
        for step, name in enumerate(invalid):
            assert error_of(rec, step) == {"code": -32001, "message": "Feature set not enabled",
                                           "data": {"featureSet": name}}, name
        policy = next(m for m in rec.received if m.get("method") == "featureSets/update")
        assert set(invalid) <= set(policy["params"]["disabled"])
        (ready,) = logged(logs, "connector.ready", connector="fs")
        assert {name: ready["feature_sets"][name] for name in invalid} == dict.fromkeys(invalid, "invalid_uses")

    async def test_a_feature_set_never_authorizes_what_the_grant_lacks(self, tmp_path) -> None:
        """Naming a set in `enabled` whose uses list pushEvents does not grant pushEvents (docs/mcpl-checklist.md item 10)."""
        spec = run(tmp_path, "named", [pushing(push(feature_set="alerts"))], grant=["channels.register"],
                   feature_sets=FeatureSetSelection(enabled=["alerts", "chat"]))
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "named").done)
        rec = record(tmp_path, "named")
        assert error_of(rec, 0)["data"] == {"capability": "pushEvents"}
        params = next(m for m in rec.received if m.get("method") == "featureSets/update")["params"]
        assert "alerts" in params["disabled"] and "alerts" not in params["enabled"]


class TestOrigin:
    async def test_origin_is_testimony_kept_under_adapter_and_never_a_place_or_an_identity(self, tmp_path) -> None:
        """origin's serverId, channel and claims change nothing: the push is this connector's, unscoped."""
        origin = {"source": "reminder", "serverId": "other", "mcplChannelId": "a:g1:room",
                  "grant": ["*"], "sourceHeader": "[source: other / a:g1:room]"}
        owner = run(tmp_path, "a", [register("a:g1:room"),
                                    pushing(push("e-own", feature_set="alerts",
                                                 origin={"mcplChannelId": "a:g1:room"}))])
        claimant = run(tmp_path, "b", [pushing(push("e-claim", feature_set="alerts", origin=origin))])
        async with memory_host(config_with(tmp_path, owner, claimant)):
            await wait_for(lambda: record(tmp_path, "a").done and record(tmp_path, "b").done)
            items = await items_when(tmp_path, 2)
        by_server = {item.metadata["serverId"]: item for item in items}
        claimed = by_server["b"]
        assert texts(claimed.content)[0] == "[source: b · unscoped]"
        assert claimed.metadata["channelId"] is None
        assert claimed.metadata["adapter"] == {k: v for k, v in origin.items() if k != "sourceHeader"}
        assert texts(by_server["a"].content)[0].startswith("[source: a / a:g1:room")


class TestDedup:
    async def test_a_repeated_event_id_gets_the_original_answer_and_stores_once(self, tmp_path) -> None:
        """The same eventId again answers as the first time and stores nothing; another connector's is its own."""
        steps = [pushing(push("e-1", feature_set="alerts", body="first")),
                 pushing(push("e-1", feature_set="alerts", body="second")),
                 pushing(push("e-2", feature_set="alerts", body="third"))]
        specs = [run(tmp_path, "dup", steps), run(tmp_path, "other", [pushing(push("e-1", feature_set="alerts"))])]
        async with memory_host(config_with(tmp_path, *specs)):
            await wait_for(lambda: all(record(tmp_path, s.name).done for s in specs))
        rec = record(tmp_path, "dup")
        assert result_of(rec, 1) == result_of(rec, 0) == {"accepted": True}
        items = await items_when(tmp_path, 3)
        assert sorted((i.metadata["serverId"], texts(i.content)[-1]) for i in items) == [
            ("dup", "first"), ("dup", "third"), ("other", "ping")]


    async def test_repeats_in_flight_at_once_store_once(self, tmp_path) -> None:
        """Several copies of one event sent without waiting for answers still give one item and one answer."""
        copies = [["push/event", push("e-1", feature_set="alerts", body=f"copy {n}")] for n in range(5)]
        async with memory_host(config_with(tmp_path, run(tmp_path, "burst", [{"requests": copies}]))):
            await wait_for(lambda: record(tmp_path, "burst").done)
        answers = [e for e in record(tmp_path, "burst").events if e["kind"] == "answer"]
        assert [a.get("result") for a in answers] == [{"accepted": True}] * 5
        assert len(await items_when(tmp_path, 1)) == 1


class TestAudit:
    async def test_every_operation_leaves_one_audit_line_with_its_outcome(self, tmp_path) -> None:
        """Admitted and refused pushes, incoming batches and registrations each log their outcome."""
        steps = [pushing(push("e-ok", feature_set="alerts")),
                 pushing(push("e-no", feature_set="nope")),
                 register("a:1"),
                 {"request": "channels/incoming", "params": {"messages": [
                     {"channelId": "a:1", "messageId": "m-1", "content": [{"type": "text", "text": "hi"}]},
                     {"channelId": "a:2", "messageId": "m-2", "content": [{"type": "text", "text": "hi"}]}]}}]
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, run(tmp_path, "audited", steps))):
                await wait_for(lambda: record(tmp_path, "audited").done)
        (admitted,) = logged(logs, "mcpl.push", connector="audited")
        assert (admitted["featureSet"], admitted["eventId"]) == ("alerts", "e-ok")
        assert admitted["outcome"] == {"accepted": True}
        (refused,) = logged(logs, "mcpl.refused", connector="audited")
        assert (refused["method"], refused["featureSet"], refused["code"]) == ("push/event", "nope", -32003)
        (batch,) = logged(logs, "mcpl.incoming", connector="audited")
        assert (batch["messages"], batch["accepted"]) == (2, 1)
        (registered,) = logged(logs, "mcpl.channels", connector="audited")
        assert (registered["method"], registered["accepted"], registered["refused"]) == ("channels/register", 1, 0)
