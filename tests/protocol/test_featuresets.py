"""Tests for mcplhost/protocol/featuresets.py (SPEC §6, §9; docs/mcpl-compat.md)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.protocol.featuresets import (
    FeatureSetState,
    check_feature_set,
    derive_feature_sets,
    expand_selection,
    normalize_feature_sets,
    selection_matches,
    uses_valid,
)
from mcplhost.protocol.vocabulary import SORTED_CAPABILITY_PATHS
from mcplhost.rpc.errors import error_for

PATHS = list(SORTED_CAPABILITY_PATHS)


def state(name: str, uses: set[str], enabled: bool = True, reason: str | None = None) -> FeatureSetState:
    return FeatureSetState(name=name, enabled=enabled, reason=reason, uses=frozenset(uses))


class TestNormalizeFeatureSets:
    def test_object_form(self) -> None:
        """The 0.5 form, keyed by name, is kept as is."""
        raw = {"memory.x": {"description": "d", "uses": ["pushEvents"]}}
        assert normalize_feature_sets(raw) == raw

    def test_array_form(self) -> None:
        """The deployed 0.4 array of `{name, ...}` becomes the keyed form without `name`."""
        raw = [{"name": "heartbeat", "description": "d", "uses": ["tools"], "rollback": False, "hostState": {}}]
        assert normalize_feature_sets(raw) == {
            "heartbeat": {"description": "d", "uses": ["tools"], "rollback": False, "hostState": {}}
        }

    def test_entries_without_a_usable_name_are_skipped(self) -> None:
        """Nameless, empty-named and non-object entries are dropped."""
        raw = [{"description": "no name"}, {"name": ""}, {"name": 3}, "x", None, {"name": "ok", "uses": []}]
        assert normalize_feature_sets(raw) == {"ok": {"uses": []}}
        assert normalize_feature_sets({"": {"uses": ["tools"]}}) == {}

    def test_non_object_declaration_stays_declared(self) -> None:
        """A declaration that is not an object becomes empty, so it derives to invalid_uses."""
        assert normalize_feature_sets({"f": "tools"}) == {"f": {}}

    def test_duplicate_array_names_fail_closed(self) -> None:
        """A name the array form declares twice gets an empty, invalid declaration."""
        raw = [{"name": "f", "uses": ["tools"]}, {"name": "f", "uses": ["pushEvents"]}]
        assert normalize_feature_sets(raw) == {"f": {}}

    @pytest.mark.parametrize("raw", [None, "x", 3, True])
    def test_garbage(self, raw: Any) -> None:
        """Anything else declares nothing."""
        assert normalize_feature_sets(raw) == {}


class TestUsesValid:
    def test_vocabulary_paths(self) -> None:
        """A non-empty list of vocabulary paths is valid."""
        assert uses_valid({"uses": ["pushEvents", "contextHooks.beforeInference.inject.beforeUser"]})

    @pytest.mark.parametrize(
        "declaration",
        [
            {},
            {"uses": []},
            {"uses": "pushEvents"},
            {"uses": ["pushEvents", 1]},
            {"uses": ["contextHooks.beforeInference"]},
            {"uses": ["channels"]},
            {"uses": ["teleport"]},
            {"uses": None},
            "not an object",
        ],
    )
    def test_fails_closed(self, declaration: Any) -> None:
        """Absent, empty, non-list, non-string, parent or unknown `uses` is invalid (docs/mcpl-checklist.md item 19)."""
        assert not uses_valid(declaration)


class TestSelection:
    def test_trailing_star_selects_the_subtree(self) -> None:
        """`memory.*` selects every `memory.` name at any depth, but not `memory` itself."""
        assert selection_matches("memory.*", "memory.retrieval")
        assert selection_matches("memory.*", "memory.retrieval.fast")
        assert not selection_matches("memory.*", "memory")
        assert not selection_matches("memory.*", "memoryx.a")

    def test_inner_star_is_one_segment(self) -> None:
        """A `*` before the end stands for exactly one segment."""
        assert selection_matches("*.retrieval", "memory.retrieval")
        assert not selection_matches("*.retrieval", "a.b.retrieval")

    def test_expand(self) -> None:
        """Wildcards expand against declared names; literal names are kept as written."""
        names = ["memory.retrieval", "memory.extraction", "body.presence"]
        assert expand_selection(["memory.*", "other.literal"], names) == [
            "memory.extraction",
            "memory.retrieval",
            "other.literal",
        ]

    def test_star_inside_a_segment_is_literal(self) -> None:
        """`mem*` is a name, not a pattern."""
        assert expand_selection(["mem*"], ["memory"]) == ["mem*"]


DECLARED = {
    "memory.retrieval": {"description": "d", "uses": ["contextHooks.beforeInference.observe"]},
    "memory.proactive": {"description": "d", "uses": ["pushEvents"]},
    "stale": {"description": "d", "uses": ["contextHooks.beforeInference"]},
}


class TestDeriveFeatureSets:
    def test_enabled_when_granted(self) -> None:
        """A valid set whose `uses` is granted is enabled, with no reason."""
        states = derive_feature_sets(DECLARED, {"pushEvents"}, None, [])
        assert states["memory.proactive"] == state("memory.proactive", {"pushEvents"})

    def test_capability_denied(self) -> None:
        """A valid set needing an ungranted path is disabled as a derived degradation."""
        states = derive_feature_sets(DECLARED, {"pushEvents"}, None, [])
        assert states["memory.retrieval"].reason == "capability_denied"
        assert not states["memory.retrieval"].enabled

    def test_invalid_uses(self) -> None:
        """A parent path in `uses` disables the set with invalid_uses, whatever the grant."""
        states = derive_feature_sets(DECLARED, set(PATHS), None, [])
        assert (states["stale"].enabled, states["stale"].reason) == (False, "invalid_uses")

    def test_not_selected(self) -> None:
        """When `enabled` is given, sets it does not name are not_selected."""
        states = derive_feature_sets(DECLARED, set(PATHS), ["memory.proactive"], [])
        assert states["memory.retrieval"].reason == "not_selected"
        assert states["memory.proactive"].enabled

    def test_empty_enabled_selects_nothing(self) -> None:
        """`enabled: []` is a restriction to nothing, unlike an absent `enabled`."""
        states = derive_feature_sets(DECLARED, set(PATHS), [], [])
        assert {s.reason for s in states.values()} == {"not_selected"}

    def test_disabled_subtracts(self) -> None:
        """`disabled` removes a set even when `enabled` names it."""
        states = derive_feature_sets(DECLARED, set(PATHS), ["memory.*"], ["memory.proactive"])
        assert states["memory.proactive"].reason == "disabled"
        assert states["memory.retrieval"].enabled

    def test_operator_reasons_come_first(self) -> None:
        """An unselected set reports not_selected even if its uses is also invalid."""
        states = derive_feature_sets(DECLARED, set(), ["memory.proactive"], [])
        assert states["stale"].reason == "not_selected"

    def test_uses_holds_recognized_paths(self) -> None:
        """`uses` in the state keeps only vocabulary paths."""
        declared = {"f": {"uses": ["pushEvents", "contextHooks.beforeInference", 3]}}
        assert derive_feature_sets(declared, set(), None, [])["f"].uses == {"pushEvents"}

    def test_state_is_frozen(self) -> None:
        """States are immutable values."""
        with pytest.raises(AttributeError):
            state("f", {"tools"}).enabled = False  # type: ignore[misc]
        assert msgspec.structs.replace(state("f", {"tools"}), enabled=False).enabled is False

    @given(
        st.dictionaries(
            st.text(min_size=1),
            st.fixed_dictionaries({"uses": st.lists(st.sampled_from(PATHS + ["channels", "x"]))}),
        ),
        st.sets(st.sampled_from(PATHS)),
        st.sets(st.sampled_from(PATHS)),
    )
    def test_fail_closed_and_narrowing(
        self, declared: dict[str, Any], grant: set[str], revoked: set[str]
    ) -> None:
        """Enabled implies valid uses within the grant; narrowing the grant never enables a set."""
        wide = derive_feature_sets(declared, grant, None, [])
        narrow = derive_feature_sets(declared, grant - revoked, None, [])
        for name, current in wide.items():
            assert current.enabled == (current.reason is None)
            if current.enabled:
                assert uses_valid(declared[name]) and current.uses <= grant
            if narrow[name].enabled:
                assert current.enabled


STATES = {
    "memory.proactive": state("memory.proactive", {"pushEvents"}),
    "memory.tools": state("memory.tools", {"tools"}),
    "off": state("off", {"pushEvents"}, enabled=False, reason="disabled"),
    "unselected": state("unselected", {"pushEvents"}, enabled=False, reason="not_selected"),
    "denied": state("denied", {"tools"}, enabled=False, reason="capability_denied"),
    "invalid": state("invalid", set(), enabled=False, reason="invalid_uses"),
}


def refusal(feature_set: Any, *, legacy: bool = False) -> dict[str, Any] | None:
    refused = check_feature_set(STATES, feature_set, "pushEvents", legacy=legacy)
    return None if refused is None else msgspec.to_builtins(error_for(refused))


class TestCheckFeatureSet:
    def test_admits(self) -> None:
        """A declared, enabled set whose uses lists the capability is admitted."""
        assert refusal("memory.proactive") is None

    def test_not_declared(self) -> None:
        """An undeclared set is -32003 with {featureSet}."""
        assert refusal("ghost") == {
            "code": -32003,
            "message": "Unknown feature set",
            "data": {"featureSet": "ghost"},
        }

    @pytest.mark.parametrize("name", ["off", "unselected", "denied", "invalid"])
    def test_not_enabled(self, name: str) -> None:
        """A disabled set is -32001 with exactly {featureSet}: no canEnable, no reason."""
        refused = refusal(name)
        assert refused is not None
        assert (refused["code"], refused["data"]) == (-32001, {"featureSet": name})

    def test_declaration_mismatch(self) -> None:
        """An enabled set that did not list the capability is -32001 declaration_mismatch."""
        refused = refusal("memory.tools")
        assert refused is not None
        assert (refused["code"], refused["data"]) == (
            -32001,
            {"featureSet": "memory.tools", "capability": "pushEvents", "reason": "declaration_mismatch"},
        )

    @pytest.mark.parametrize("value", [None, "", 3])
    def test_missing_feature_set(self, value: Any) -> None:
        """A missing or non-string featureSet is -32602."""
        refused = refusal(value)
        assert refused is not None and refused["code"] == -32602


class TestCheckFeatureSetLegacy:
    def test_uses_does_not_gate(self) -> None:
        """In 0.4 mode heartbeat's `uses: ["tools"]` set may still push (docs/mcpl-compat.md)."""
        assert refusal("memory.tools", legacy=True) is None

    @pytest.mark.parametrize("name", ["denied", "invalid"])
    def test_derived_degradation_does_not_gate(self, name: str) -> None:
        """Sets disabled only because of their `uses` are admitted in 0.4 mode."""
        assert refusal(name, legacy=True) is None

    @pytest.mark.parametrize("name", ["off", "unselected"])
    def test_operator_selection_still_gates(self, name: str) -> None:
        """The operator's disabled and not_selected still refuse with -32001."""
        refused = refusal(name, legacy=True)
        assert refused is not None and refused["code"] == -32001

    def test_declared_still_gates(self) -> None:
        """An undeclared set is still -32003 in 0.4 mode."""
        refused = refusal("ghost", legacy=True)
        assert refused is not None and refused["code"] == -32003
