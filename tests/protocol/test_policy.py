"""Unit tests for mcplhost/protocol/policy.py: the policy exchange as pure rules."""

import msgspec
from msgspec import Raw

from mcplhost.protocol.featuresets import derive_feature_sets
from mcplhost.protocol.policy import interim, judge_receipt, policy_params
from mcplhost.rpc import ErrorObject, RemoteError


def raw(value: object) -> Raw:
    return Raw(msgspec.json.encode(value))


def judge(outcome, *, legacy=False, initial=True, strict=False, operator_fallback="mcp-only"):
    return judge_receipt(outcome, legacy=legacy, initial=initial, strict=strict, operator_fallback=operator_fallback)


class TestJudgeReceipt:
    def test_accepted(self) -> None:
        """An accepted receipt makes the connection ready, with its own account kept for the log."""
        verdict = judge(raw({"accepted": True, "mode": "degraded", "unavailableFeatures": [{"featureSet": "x"}]}))
        assert verdict.ready and verdict.mode == "degraded" and verdict.unavailable == 1
        assert verdict.defects == ("unavailableFeatures entry without effect",)

    def test_method_not_found_is_a_legacy_acknowledgement(self) -> None:
        """-32601 to the initial policy means a legacy server acknowledged it, unless configured strictly 0.5."""
        error = RemoteError(ErrorObject(-32601, "Method not found"))
        assert judge(error).legacy_ack
        assert not judge(error, strict=True).ready
        assert judge(error, initial=False, legacy=True).ready
        assert not judge(error, initial=False).ready

    def test_refusals_use_their_fallback_or_the_operators(self) -> None:
        """accepted:false names its fallback; a missing or unknown one falls to the operator's choice."""
        assert judge(raw({"accepted": False, "fallback": "close"})).fallback == "close"
        assert judge(raw({"accepted": False, "fallback": "mcp-only"}), operator_fallback="close").fallback == "mcp-only"
        missing = judge(raw({"accepted": False}), operator_fallback="close")
        assert missing.fallback == "close" and missing.defects == ("refusal without a valid fallback",)
        assert judge(raw({"accepted": False, "fallback": "sulk"})).fallback == "mcp-only"

    def test_unusable_answers_fall_back(self) -> None:
        """A receipt that is not a receipt, or another error, never makes the connection ready."""
        for outcome in (raw([1]), raw({"accepted": "yes"}), RemoteError(ErrorObject(-32603, "boom"))):
            assert not judge(outcome).ready


class TestPolicyParams:
    def test_grant_always_sent_and_disjoint_from_denied(self) -> None:
        """effectiveCapabilities is present even when empty and never shares a path with deniedCapabilities."""
        capabilities = {"experimental": {"mcpl": {"pushEvents": True, "channels": {"publish": True}}}}
        empty = policy_params(capabilities, frozenset(), {}, legacy=False, selection_given=False)
        assert empty["effectiveCapabilities"] == [] and "enabled" not in empty
        params = policy_params(capabilities, frozenset({"pushEvents"}), {}, legacy=False, selection_given=True)
        assert params["effectiveCapabilities"] == ["pushEvents"]
        assert params["deniedCapabilities"] == ["channels.publish"] and params["enabled"] == []


class TestInterim:
    def test_only_narrowing_applies_before_the_receipt(self) -> None:
        """Dropped paths go at once, added ones wait; a set enabled only by the change stays off."""
        declared = {"a": {"description": "a", "uses": ["pushEvents"]},
                    "b": {"description": "b", "uses": ["channels.publish"]}}

        def derive(grant: frozenset[str]):
            return derive_feature_sets(declared, grant, None, [])

        now = frozenset({"pushEvents"})
        kept, states = interim(now, derive(now), frozenset({"channels.publish"}), derive)
        assert kept == frozenset()
        assert not states["a"].enabled and not states["b"].enabled


class TestLegacyDisabled:
    """docs/mcpl-compat.md: legacy `disabled` names only the operator's deselection; 0.5 fails closed."""

    DECLARED = {"messaging": {"description": "m", "uses": ["pushEvents", "channels.typing"]},
                "history": {"description": "h", "uses": ["tools"]},
                "off": {"description": "o", "uses": ["pushEvents"]},
                "broken": {"description": "b"}}

    def params(self, *, legacy: bool, enabled: list[str] | None = None) -> dict:
        grant = frozenset({"pushEvents"})
        states = derive_feature_sets(self.DECLARED, grant, enabled, ["off"])
        return policy_params({}, grant, states, legacy=legacy, selection_given=enabled is not None)

    def test_legacy_never_disables_a_set_only_because_its_uses_exceed_the_grant(self) -> None:
        """Under legacy rules only the operator's `disabled` is sent, not capability_denied or invalid_uses sets."""
        assert self.params(legacy=True)["disabled"] == ["off"]

    def test_legacy_enabled_lists_everything_the_operator_selected(self) -> None:
        """With an enabled list, legacy `enabled` holds every selected set that the operator did not disable."""
        params = self.params(legacy=True, enabled=["messaging", "history", "off"])
        assert params["enabled"] == ["history", "messaging"]
        assert params["disabled"] == ["broken", "off"]  # broken: not selected, an operator reason

    def test_0_5_names_every_set_that_is_off_fail_closed(self) -> None:
        """Under 0.5 rules a set whose uses exceed the grant, or are invalid, is disabled on the wire too."""
        assert self.params(legacy=False)["disabled"] == ["broken", "history", "messaging", "off"]
