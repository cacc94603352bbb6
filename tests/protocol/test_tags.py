"""Tests for mcplhost/protocol/tags.py (SPEC §16.3; docs/mcpl-checklist.md items 28-29)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.protocol.tags import CORE_EDGES, expand_tags, is_namespaced, producer_implies

CORE_VOCABULARY = [
    f"chat:{name}"
    for name in (
        "addressed mention reply dm ambient broadcast to-self from-human from-bot from-self "
        "from-agent edited deleted reaction reaction-remove has-image has-audio has-file "
        "has-link command private group thread"
    ).split()
]
tag_lists = st.lists(
    st.one_of(
        st.sampled_from(CORE_VOCABULARY),
        st.sampled_from(["mention", "dm", "demo:x", "demo:y", "mcpl:z", "chat:", ":x"]),
        st.text(),
    )
)
producer_edges = st.dictionaries(
    st.one_of(st.sampled_from(CORE_VOCABULARY + ["demo:x", "demo:y", "mention"]), st.text()),
    st.lists(st.one_of(st.sampled_from(CORE_VOCABULARY + ["demo:x", "demo:y", "plain"]), st.text())),
)


class TestCoreClosure:
    def test_spec_edges_only(self) -> None:
        """The core table holds exactly the three edges SPEC §16.3 defines."""
        assert {k: set(v) for k, v in CORE_EDGES.items()} == {
            "chat:mention": {"chat:addressed"},
            "chat:reply": {"chat:addressed"},
            "chat:dm": {"chat:addressed", "chat:private"},
        }

    def test_mention(self) -> None:
        """A mention is addressed."""
        assert expand_tags(["chat:mention"]) == ["chat:addressed", "chat:mention"]

    def test_dm(self) -> None:
        """A DM is addressed and private."""
        assert expand_tags(["chat:dm"]) == ["chat:addressed", "chat:dm", "chat:private"]

    def test_ambient_dropped_when_addressed(self) -> None:
        """`chat:ambient` goes once expansion yields `chat:addressed`."""
        assert expand_tags(["chat:ambient", "chat:reply"]) == ["chat:addressed", "chat:reply"]

    def test_ambient_kept_otherwise(self) -> None:
        """`chat:ambient` stays when nothing addresses the agent."""
        assert expand_tags(["chat:ambient", "chat:from-bot"]) == ["chat:ambient", "chat:from-bot"]

    def test_set_semantics_and_sorting(self) -> None:
        """Order and duplicates in the input do not matter; the output is sorted."""
        assert expand_tags(["demo:b", "chat:group", "demo:b", "demo:a"]) == [
            "chat:group",
            "demo:a",
            "demo:b",
        ]

    def test_un_namespaced_tags_are_kept_but_not_core(self) -> None:
        """A bare `mention` survives but does not imply `chat:addressed`."""
        assert expand_tags(["mention", "dm"]) == ["dm", "mention"]

    def test_non_strings_are_dropped(self) -> None:
        """Junk entries vanish instead of raising."""
        assert expand_tags(["chat:dm", 3, None]) == ["chat:addressed", "chat:dm", "chat:private"]  # type: ignore[list-item]


class TestProducerEdges:
    def test_not_applied_unless_passed(self) -> None:
        """Without accepted edges, a producer tag implies nothing."""
        assert expand_tags(["demo:role-mention"]) == ["demo:role-mention"]

    def test_accepted_edges_are_transitive_with_core(self) -> None:
        """Accepted edges chain into the core closure."""
        accepted = {"demo:role-mention": ["demo:ping"], "demo:ping": ["chat:mention"]}
        assert expand_tags(["demo:role-mention", "chat:ambient"], accepted) == [
            "chat:addressed",
            "chat:mention",
            "demo:ping",
            "demo:role-mention",
        ]

    def test_cycles_terminate(self) -> None:
        """A cyclic ontology expands once and stops."""
        accepted = {"demo:a": ["demo:b"], "demo:b": ["demo:a"]}
        assert expand_tags(["demo:a"], accepted) == ["demo:a", "demo:b"]

    def test_edges_never_start_or_end_at_invalid_tags(self) -> None:
        """Un-namespaced tags neither trigger an edge nor get added by one."""
        accepted = {"mention": ["chat:addressed"], "demo:x": ["bare"]}
        assert expand_tags(["mention", "demo:x"], accepted) == ["demo:x", "mention"]

    def test_collects_implies_from_ontologies(self) -> None:
        """`tagOntology.tags.<t>.implies` edges of all feature sets are merged."""
        declared = {
            "a": {"uses": ["pushEvents"], "tagOntology": {"tags": {
                "demo:x": {"implies": ["chat:ambient", "demo:y"]},
                "demo:z": {"facet": "addressing"},
            }}},
            "b": {"tagOntology": {"tags": {"demo:x": {"implies": ["demo:w", 5]}}}},
            "c": {"tagOntology": "garbage"},
            "d": "garbage",
        }
        assert producer_implies(declared) == {"demo:x": ["chat:ambient", "demo:w", "demo:y"]}


class TestIsNamespaced:
    def test_forms(self) -> None:
        """`ns:value` and `ns:key=value` are tags; bare words and empty parts are not."""
        assert is_namespaced("chat:dm") and is_namespaced("demo:urgency=high")
        assert not any(is_namespaced(t) for t in ("mention", "chat:", ":dm", ""))


class TestProperties:
    @given(tag_lists, st.one_of(st.none(), producer_edges))
    def test_idempotent(self, tags: list[str], accepted: dict[str, list[str]] | None) -> None:
        """Expanding an expanded set changes nothing."""
        once = expand_tags(tags, accepted)
        assert expand_tags(once, accepted) == once

    @given(tag_lists, st.one_of(st.none(), producer_edges))
    def test_addressing_edges_hold(self, tags: list[str], accepted: dict[str, list[str]] | None) -> None:
        """mention, reply and dm imply addressed; dm implies private."""
        out = set(expand_tags(tags, accepted))
        if out & {"chat:mention", "chat:reply", "chat:dm"}:
            assert "chat:addressed" in out
        if "chat:dm" in out:
            assert "chat:private" in out

    @given(tag_lists, st.one_of(st.none(), producer_edges))
    def test_never_ambient_and_addressed(self, tags: list[str], accepted: dict[str, list[str]] | None) -> None:
        """The output never holds both opposites."""
        assert not {"chat:ambient", "chat:addressed"} <= set(expand_tags(tags, accepted))

    @given(tag_lists, st.one_of(st.none(), producer_edges))
    def test_only_adds_besides_ambient(self, tags: list[str], accepted: dict[str, list[str]] | None) -> None:
        """Every input tag except `chat:ambient` is in the output, which is sorted and unique."""
        out = expand_tags(tags, accepted)
        assert set(tags) - {"chat:ambient"} <= set(out)
        assert out == sorted(set(out))

    @given(tag_lists, producer_edges)
    def test_accepting_edges_only_adds(self, tags: list[str], accepted: dict[str, list[str]]) -> None:
        """Accepted producer edges add tags to the core expansion; they remove at most ambient."""
        assert set(expand_tags(tags)) - {"chat:ambient"} <= set(expand_tags(tags, accepted))
