"""Tests for mcplhost/protocol/grants.py (SPEC §5.1, §5.4, §6.2)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.protocol.connection import HOST_MCPL_CAPABILITIES, OFFERED
from mcplhost.protocol.grants import (
    HOOK_PATHS,
    IMPLEMENTED,
    INFERENCE_PATHS,
    advertised_paths,
    denied_paths,
    effective_grant,
    host_capabilities,
    mcp_only_grant,
    missing_grant_hint,
    offered_paths,
    pattern_matches,
    policy_allows,
    unknown_grant_problem,
)
from mcplhost.protocol.vocabulary import (
    CAPABILITY_PATHS,
    INJECT_SYSTEM,
    SORTED_CAPABILITY_PATHS,
)

ALL_PATHS = list(SORTED_CAPABILITY_PATHS)
ONE_SEGMENT_PATHS = {"pushEvents", "tools", "modelInfo", "inferenceRequest", "inferenceLifecycle"}


def caps(mcpl: Any, **mcp: Any) -> dict[str, Any]:
    """An initialize result's `capabilities` with `mcpl` as the MCPL block."""
    return {**mcp, "experimental": {"mcpl": mcpl}}


# Advertises every one of the 17 paths.
EVERYTHING = caps(
    {
        "version": "0.5",
        "pushEvents": True,
        "modelInfo": True,
        "inferenceLifecycle": True,
        "inferenceRequest": True,
        "contextHooks": True,
        "channels": True,
    },
    tools={},
)


# --- strategies --------------------------------------------------------------

SEGMENTS = sorted({segment for path in CAPABILITY_PATHS for segment in path.split(".")})
member_names = st.one_of(
    st.sampled_from(SEGMENTS),
    st.sampled_from(["version", "revision", "featureSets", "a.b", "channels.publish", ""]),
    st.text(max_size=8),
)
json_scalars = st.one_of(st.booleans(), st.none(), st.integers(), st.floats(allow_nan=False), st.text())
# Advertisement trees: mostly booleans and objects keyed by real segments, with junk mixed in.
trees = st.recursive(
    st.one_of(st.booleans(), json_scalars),
    lambda children: st.dictionaries(member_names, children, max_size=6)
    | st.lists(children, max_size=3),
    max_leaves=30,
)
capabilities_objects = st.one_of(
    st.just(EVERYTHING),
    st.builds(
        lambda mcpl, tools: caps(mcpl) if tools is None else caps(mcpl, tools=tools),
        trees,
        st.one_of(st.none(), st.just({}), st.just(False), st.just(True)),
    ),
    trees,  # garbage where the whole object should be
)


def _pattern_from(path: str, draw: st.DrawFn) -> str:
    segments = [
        "*" if draw(st.booleans()) else segment for segment in path.split(".")
    ]
    return ".".join(segments)


@st.composite
def patterns(draw: st.DrawFn) -> str:
    """Policy patterns: vocabulary paths with some segments starred, parents, and junk."""
    path = draw(st.sampled_from(ALL_PATHS))
    return draw(
        st.one_of(
            st.just(path),
            st.just(_pattern_from(path, draw)),
            st.just(path.rsplit(".", 1)[0]),
            st.sampled_from(["*", "*.*", "*.*.*.*", "channels", "chan*", ""]),
            st.text(max_size=12),
        )
    )


policies = st.lists(patterns(), max_size=8)


# --- advertisement -----------------------------------------------------------


class TestAdvertisedPaths:
    def test_true_means_every_leaf_beneath(self) -> None:
        """`beforeInference: true` advertises observe and all three inject leaves."""
        assert advertised_paths(caps({"contextHooks": {"beforeInference": True}})) == {
            "contextHooks.beforeInference.observe",
            "contextHooks.beforeInference.inject.system",
            "contextHooks.beforeInference.inject.beforeUser",
            "contextHooks.beforeInference.inject.afterUser",
        }

    def test_nested_leaves(self) -> None:
        """The walk reaches depth-4 leaves and honours false beside true."""
        manifest = {
            "contextHooks": {
                "beforeInference": {"inject": {"system": False, "beforeUser": True}}
            }
        }
        assert advertised_paths(caps(manifest)) == {"contextHooks.beforeInference.inject.beforeUser"}

    def test_object_node_counts_at_its_own_path(self) -> None:
        """`inferenceRequest: {streaming: false}` advertises `inferenceRequest` alone."""
        assert advertised_paths(caps({"inferenceRequest": {"streaming": False}})) == {
            "inferenceRequest"
        }

    def test_false_null_and_non_boolean_values_advertise_nothing(self) -> None:
        """Only `true` and objects advertise; false, null, 1, "yes" and arrays do not."""
        manifest = {
            "pushEvents": False,
            "modelInfo": None,
            "inferenceLifecycle": 1,
            "channels": {"publish": "yes", "register": [True]},
        }
        assert advertised_paths(caps(manifest)) == frozenset()

    def test_unknown_paths_are_dropped(self) -> None:
        """A path outside the vocabulary is never advertised as far as the host is concerned."""
        manifest = {"channels": {"register": True, "teleport": True}, "futureThing": True}
        assert advertised_paths(caps(manifest)) == {"channels.register"}

    def test_dotted_member_names_never_advertise(self) -> None:
        """Member names holding '.' alias other trees and are ignored."""
        manifest = {
            "channels.publish": True,
            "contextHooks": {"beforeInference.observe": True},
            "inferenceRequest": {"streaming.x": True},
        }
        assert advertised_paths(caps(manifest)) == {"inferenceRequest"}

    def test_non_capability_members_are_skipped(self) -> None:
        """`version`, `revision` and `featureSets` are not walked."""
        manifest = {
            "version": "0.5",
            "revision": True,
            "featureSets": {"pushEvents": True, "x": {"uses": ["pushEvents"]}},
        }
        assert advertised_paths(caps(manifest)) == frozenset()

    def test_tools_come_from_mcp_capabilities(self) -> None:
        """`tools` is advertised by MCP's `capabilities.tools`, not by the MCPL block."""
        assert advertised_paths({"tools": {}}) == {"tools"}
        assert advertised_paths({"tools": {"listChanged": True}}) == {"tools"}
        assert advertised_paths({"tools": False}) == frozenset()
        assert advertised_paths({"tools": None}) == frozenset()
        assert advertised_paths(caps({"tools": True})) == frozenset()

    def test_all_seventeen(self) -> None:
        """The fixture advertising everything yields exactly the vocabulary."""
        assert advertised_paths(EVERYTHING) == CAPABILITY_PATHS

    def test_garbage_is_tolerated(self) -> None:
        """Malformed shapes advertise nothing instead of raising."""
        for garbage in (None, [], "x", {"experimental": "x"}, {"experimental": {"mcpl": []}},
                        {"experimental": {"mcpl": True}}, {"experimental": None}):
            assert advertised_paths(garbage) == frozenset()

    def test_deep_junk_is_not_walked(self) -> None:
        """Nesting that cannot lead to a vocabulary path is not descended into."""
        junk: dict[str, Any] = {}
        node = junk
        for _ in range(10_000):
            node["x"] = {}
            node = node["x"]
        assert advertised_paths(caps({"vendor": junk, "channels": {"x": junk}})) == frozenset()

    @given(capabilities_objects)
    def test_never_raises_and_stays_in_vocabulary(self, capabilities: Any) -> None:
        """Any input gives a subset of the vocabulary."""
        assert advertised_paths(capabilities) <= CAPABILITY_PATHS

    @given(trees, st.sampled_from(SEGMENTS))
    def test_true_never_advertises_less_than_an_object(self, tree: Any, name: str) -> None:
        """Replacing a member's value with `true` only ever adds advertised paths."""
        mcpl = {name: tree}
        assert advertised_paths(caps(mcpl)) <= advertised_paths(caps({name: True}))


# --- pattern matching ----------------------------------------------------------


class TestPatternMatches:
    def test_star_is_one_segment(self) -> None:
        """`channels.*` matches `channels.publish` but not `channels` or anything deeper."""
        assert pattern_matches("channels.*", "channels.publish")
        assert not pattern_matches("channels.*", "channels")
        assert not pattern_matches("contextHooks.*", "contextHooks.beforeInference.observe")

    def test_bare_star_matches_only_one_segment_paths(self) -> None:
        """`*` matches `pushEvents` and not `channels.publish`."""
        assert pattern_matches("*", "pushEvents")
        assert not pattern_matches("*", "channels.publish")

    def test_no_partial_segment_wildcard(self) -> None:
        """A `*` inside a segment is an ordinary character."""
        assert not pattern_matches("chan*.publish", "channels.publish")
        assert not pattern_matches("channels.pub*", "channels.publish")

    def test_literal(self) -> None:
        """A pattern without `*` matches only itself."""
        assert pattern_matches("channels.publish", "channels.publish")
        assert not pattern_matches("channels.publish", "channels.incoming")

    @given(st.text(), st.sampled_from(ALL_PATHS))
    def test_star_never_crosses_segments(self, pattern: str, path: str) -> None:
        """A match always has equal segment counts."""
        if pattern_matches(pattern, path):
            assert pattern.count(".") == path.count(".")

    @given(st.sampled_from(ALL_PATHS), st.data())
    def test_starring_segments_keeps_the_match(self, path: str, data: st.DataObject) -> None:
        """A path still matches after any of its segments are replaced by `*`."""
        assert pattern_matches(_pattern_from(path, data.draw), path)


# --- the effective grant ---------------------------------------------------------


class TestEffectiveGrant:
    def test_advertising_alone_grants_nothing(self) -> None:
        """An empty policy grants nothing, whatever is advertised (docs/mcpl-checklist.md item 4)."""
        assert effective_grant(EVERYTHING, []) == []

    def test_policy_alone_grants_nothing(self) -> None:
        """A path the server did not advertise is not granted."""
        assert effective_grant(caps({"pushEvents": True}), ["channels.publish"]) == []

    def test_intersection(self) -> None:
        """The grant is advertised ∩ policy."""
        capabilities = caps({"pushEvents": True, "channels": {"publish": True, "incoming": True}})
        assert effective_grant(capabilities, ["channels.publish", "modelInfo", "pushEvents"]) == [
            "channels.publish",
            "pushEvents",
        ]

    def test_channels_star(self) -> None:
        """`channels.*` grants every advertised channel path and nothing else."""
        assert effective_grant(EVERYTHING, ["channels.*"]) == sorted(
            p for p in CAPABILITY_PATHS if p.startswith("channels.")
        )

    def test_context_hooks_star_grants_no_leaf(self) -> None:
        """`contextHooks.*` grants none of the depth-3 and depth-4 hook paths."""
        assert effective_grant(EVERYTHING, ["contextHooks.*"]) == []

    def test_before_inference_star_grants_observe_only(self) -> None:
        """`contextHooks.beforeInference.*` grants observe but no inject leaf."""
        assert effective_grant(EVERYTHING, ["contextHooks.beforeInference.*"]) == [
            "contextHooks.beforeInference.observe"
        ]

    def test_bare_star(self) -> None:
        """`*` grants only one-segment paths."""
        assert set(effective_grant(EVERYTHING, ["*"])) == ONE_SEGMENT_PATHS

    def test_bare_parent_grants_nothing(self) -> None:
        """`channels` or `contextHooks.beforeInference` alone grants nothing beneath."""
        assert effective_grant(EVERYTHING, ["channels", "contextHooks.beforeInference"]) == []

    def test_inference_request_parent_is_its_own_path(self) -> None:
        """`inferenceRequest` grants the path itself, not `inferenceRequest.streaming`."""
        assert effective_grant(EVERYTHING, ["inferenceRequest"]) == ["inferenceRequest"]

    def test_inject_system_never_through_a_wildcard(self) -> None:
        """No wildcard pattern grants `inject.system`."""
        policy = ["contextHooks.beforeInference.inject.*", "*.*.*.*", "contextHooks.*.inject.*"]
        assert effective_grant(EVERYTHING, policy) == [
            "contextHooks.beforeInference.inject.afterUser",
            "contextHooks.beforeInference.inject.beforeUser",
        ]

    def test_inject_system_grantable_on_its_own(self) -> None:
        """Naming `inject.system` literally grants it alone (docs/mcpl-checklist.md item 7)."""
        assert effective_grant(EVERYTHING, [INJECT_SYSTEM]) == [INJECT_SYSTEM]

    def test_tools(self) -> None:
        """`tools` is granted from MCP's capability when policy allows it."""
        assert effective_grant({"tools": {}}, ["tools"]) == ["tools"]
        assert effective_grant({"tools": {}}, []) == []

    def test_non_string_policy_entries_are_ignored(self) -> None:
        """Junk in the policy list neither raises nor grants."""
        assert effective_grant(EVERYTHING, [None, 3, "pushEvents"]) == ["pushEvents"]  # type: ignore[list-item]

    @given(capabilities_objects, policies)
    def test_every_granted_path_was_advertised_and_allowed(
        self, capabilities: Any, policy: list[str]
    ) -> None:
        """Each granted path was advertised and matches some pattern segment for segment."""
        advertised = advertised_paths(capabilities)
        for path in effective_grant(capabilities, policy):
            assert path in advertised
            assert any(pattern_matches(pattern, path) for pattern in policy)
            if path == INJECT_SYSTEM:
                assert INJECT_SYSTEM in policy

    @given(capabilities_objects, policies)
    def test_sorted_unique_and_in_vocabulary(self, capabilities: Any, policy: list[str]) -> None:
        """The grant is sorted, has no duplicates, and holds only vocabulary paths."""
        grant = effective_grant(capabilities, policy)
        assert grant == sorted(set(grant))
        assert set(grant) <= CAPABILITY_PATHS

    @given(capabilities_objects, policies, policies)
    def test_more_patterns_never_shrink_the_grant(
        self, capabilities: Any, policy: list[str], extra: list[str]
    ) -> None:
        """Adding policy patterns only ever grows the grant."""
        assert set(effective_grant(capabilities, policy)) <= set(
            effective_grant(capabilities, policy + extra)
        )

    @given(capabilities_objects, policies)
    def test_wildcards_never_grant_inject_system(self, capabilities: Any, policy: list[str]) -> None:
        """Without the literal name, `inject.system` is never granted."""
        policy = [p for p in policy if p != INJECT_SYSTEM]
        assert INJECT_SYSTEM not in effective_grant(capabilities, policy)


class TestDeniedPaths:
    def test_advertised_minus_granted(self) -> None:
        """Denied lists what was advertised and not granted, sorted."""
        capabilities = caps({"pushEvents": True, "modelInfo": True, "channels": {"publish": True}})
        grant = effective_grant(capabilities, ["pushEvents"])
        assert denied_paths(capabilities, grant) == ["channels.publish", "modelInfo"]

    @given(capabilities_objects, policies)
    def test_disjoint_from_grant(self, capabilities: Any, policy: list[str]) -> None:
        """Denied and granted never share a path and together make up the advertisement."""
        grant = effective_grant(capabilities, policy)
        denied = denied_paths(capabilities, grant)
        assert not set(denied) & set(grant)
        assert set(denied) | set(grant) == advertised_paths(capabilities)
        assert denied == sorted(denied)


class TestImplemented:
    """What the host offers is what it implements, and what it advertises is exactly that (docs/grants.md)."""

    def test_implemented_paths_are_vocabulary_paths_typing_and_acknowledge_included(self) -> None:
        """IMPLEMENTED holds only real paths, acknowledge and typing among them; inference only with [inference]."""
        assert IMPLEMENTED <= CAPABILITY_PATHS
        assert {"channels.acknowledge", "channels.typing"} <= offered_paths()
        assert INFERENCE_PATHS <= IMPLEMENTED
        assert not offered_paths() & INFERENCE_PATHS
        assert INFERENCE_PATHS <= offered_paths(inference_configured=True)

    def test_agents_side_is_implemented_hooks_lifecycle_and_tools(self) -> None:
        """The four hook leaves, inferenceLifecycle and MCP tools are offered without [inference]."""
        agents_side = HOOK_PATHS | {"inferenceLifecycle", "tools"}
        assert agents_side <= IMPLEMENTED
        assert agents_side <= offered_paths()
        assert HOOK_PATHS == {p for p in CAPABILITY_PATHS if p.startswith("contextHooks.")}

    def test_mcp_only_keeps_only_mcp_tools_and_only_when_granted(self) -> None:
        """A plain MCP connector holds `tools` when advertised and granted, nothing else; a denial holds too."""
        plain = {"tools": {}}
        assert mcp_only_grant(plain, ["tools", "pushEvents"], offered_paths()) == {"tools"}
        assert mcp_only_grant(plain, ["pushEvents"], offered_paths()) == frozenset()
        assert mcp_only_grant({}, ["tools"], offered_paths()) == frozenset()
        assert mcp_only_grant(caps({"pushEvents": True}) | plain, ["*"], offered_paths()) == {"tools"}

    def test_inference_paths_are_offered_only_when_configured(self) -> None:
        """The seam for [inference]: implemented inference paths are dropped unless a model is configured."""
        everything = frozenset(CAPABILITY_PATHS)
        assert not offered_paths(everything) & INFERENCE_PATHS
        assert INFERENCE_PATHS <= offered_paths(everything, inference_configured=True)
        assert offered_paths() == IMPLEMENTED - INFERENCE_PATHS

    def test_the_initialize_advertisement_is_exactly_what_the_host_offers(self) -> None:
        """HOST_MCPL_CAPABILITIES, walked like any advertisement, yields OFFERED and nothing more (less MCP's `tools`)."""
        assert advertised_paths(caps(HOST_MCPL_CAPABILITIES)) == OFFERED - {"tools"}
        assert HOST_MCPL_CAPABILITIES["contextHooks"] == {"beforeInference": {
            "observe": True, "inject": {"system": True, "beforeUser": True, "afterUser": True}}}
        assert HOST_MCPL_CAPABILITIES["inferenceLifecycle"] is True
        assert HOST_MCPL_CAPABILITIES["version"] == "0.5" and HOST_MCPL_CAPABILITIES["featureSets"] is True

    @given(st.sets(st.sampled_from(ALL_PATHS)))
    def test_host_capabilities_round_trips_through_the_advertisement_walk(self, offered: set[str]) -> None:
        """Any offered set, written as a host block, reads back as itself (less MCP's own `tools`).

        A path beneath another path brings that one along (an object
        node counts at its own path), as `inferenceRequest.streaming` does.
        """
        block = host_capabilities(frozenset(offered), "0.5")
        parents = {p for p in CAPABILITY_PATHS if any(o.startswith(p + ".") for o in offered)}
        assert advertised_paths(caps(block)) == (frozenset(offered) | parents) - {"tools"}


#: Segments a grant pattern may be made of: the vocabulary's own, the wildcard, and near misses.
_SEGMENTS = sorted({s for path in CAPABILITY_PATHS for s in path.split(".")} | {"*", "incomming", "chanels", "foo"})


class TestUnknownGrantProblem:
    @given(st.lists(st.sampled_from(_SEGMENTS), min_size=1, max_size=5))
    def test_a_pattern_passes_exactly_when_it_grants_some_capability(self, segments: list[str]) -> None:
        """No problem ⇔ the pattern, alone as the policy, allows at least one vocabulary path."""
        pattern = ".".join(segments)
        grants_something = any(policy_allows([pattern], path) for path in CAPABILITY_PATHS)
        assert (unknown_grant_problem(pattern) is None) == grants_something, pattern

    def test_every_vocabulary_path_names_a_capability(self) -> None:
        """Each of the 17 paths, written out, is a good grant."""
        assert [p for p in CAPABILITY_PATHS if unknown_grant_problem(p) is not None] == []

    def test_a_misspelling_names_the_segment_and_the_likely_one(self) -> None:
        """`channels.incomming`: the bad segment, its parent, the close match and the names that fit there."""
        problem = unknown_grant_problem("channels.incomming")
        assert problem is not None
        assert "'incomming' is no capability under 'channels' (did you mean 'incoming'?)" in problem
        assert "publish" in problem

    def test_a_branch_and_a_wildcarded_system_prompt_grant_nothing(self) -> None:
        """`channels` alone and `contextHooks.*.inject.system` are problems saying why."""
        assert "is a branch, not a capability" in str(unknown_grant_problem("channels"))
        assert "literal name alone" in str(unknown_grant_problem("contextHooks.*.inject.system"))


class TestMissingGrantHint:
    def test_the_hint_names_the_side_that_lacks_the_capability(self) -> None:
        """Not offered by the host, not advertised by the connector, or simply not granted: three hints."""
        everything = frozenset(CAPABILITY_PATHS)
        assert "configure [inference]" in missing_grant_hint("modelInfo", advertised=everything, offered=frozenset())
        assert "did not advertise" in missing_grant_hint("pushEvents", advertised=frozenset(), offered=everything)
        assert missing_grant_hint("pushEvents", advertised=everything, offered=everything) == (
            "add \"pushEvents\" to this connector's grant in the config")
