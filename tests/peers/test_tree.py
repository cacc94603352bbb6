"""Tree relations from `parent` chains (mcplhost/peers/tree.py): computed, never claimed; task_list's listing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.config import MAX_TREE_DEPTH, AgentConfig
from mcplhost.peers.tree import SENDER_RELATIONSHIP, Tree

#:        lead
#:       /    \
#:    scout   writer
#:      |       |
#:    probe   editor        (and "solo", a tree of its own)
FAMILY = [("lead", None), ("scout", "lead"), ("writer", "lead"), ("probe", "scout"), ("editor", "writer"),
          ("solo", None)]


def tree(pairs: list[tuple[str, str | None]]) -> Tree:
    return Tree([AgentConfig(name=name, parent=parent, title=name.title()) for name, parent in pairs])


class TestRelation:
    @pytest.mark.parametrize(("sender", "target", "relation"), [
        ("lead", "scout", "descendant"), ("lead", "probe", "descendant"),   # down, any depth
        ("probe", "scout", "ancestor"), ("probe", "lead", "ancestor"),      # up, the root included
        ("scout", "writer", "sibling"), ("probe", "editor", "sibling"),     # siblings and cousins
        ("probe", "writer", "sibling"), ("writer", "probe", "sibling"),     # uncle and nephew
        ("scout", "scout", None), ("scout", "solo", None), ("solo", "lead", None), ("scout", "ghost", None),
    ])
    def test_the_relation_comes_from_the_parent_chains(self, sender: str, target: str, relation: str | None) -> None:
        """Down the tree is descendant, up is ancestor, any other member is a sibling; self, another tree, unknown: None."""
        assert tree(FAMILY).relation(sender, target) == relation

    def test_the_row_names_the_senders_relation_to_the_recipient(self) -> None:
        """The inverse: a message down the tree comes from an ancestor, one up from a descendant."""
        assert SENDER_RELATIONSHIP == {"descendant": "ancestor", "ancestor": "descendant", "sibling": "sibling"}

    def test_a_chain_that_loops_or_is_too_deep_is_a_tree_of_its_own(self) -> None:
        """check-config refuses both; a tree built anyway never loops and guesses no relation."""
        looped = tree([("a", "b"), ("b", "a"), ("c", None)])
        assert looped.relation("a", "b") is None and looped.members("a") == ["a"]
        deep = [("a0", None)] + [(f"a{i}", f"a{i - 1}") for i in range(1, MAX_TREE_DEPTH + 2)]
        built = tree(deep)
        assert built.relation(f"a{MAX_TREE_DEPTH}", "a0") == "ancestor"  # 32 levels: in the tree
        assert built.relation(f"a{MAX_TREE_DEPTH + 1}", "a0") is None  # 33: alone

    @given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.one_of(st.none(), st.sampled_from("abcdefgh"))),
                    max_size=12, unique_by=lambda pair: pair[0]))
    def test_relations_are_symmetric_and_any_parent_map_terminates(self, pairs) -> None:
        """For any parent map (loops included): down one way is up the other; siblings both ways; None both ways."""
        built = tree(pairs)
        names = [name for name, _ in pairs]
        inverse = {"descendant": "ancestor", "ancestor": "descendant", "sibling": "sibling", None: None}
        for sender in names:
            for target in names:
                assert built.relation(target, sender) == inverse[built.relation(sender, target)]


class TestListing:
    def test_the_default_scope_lists_descendants_only(self) -> None:
        listing = tree(FAMILY).listing("lead", "descendants", lambda name: "idle")
        assert [(row["name"], row["relationship"]) for row in listing] == [
            ("scout", "descendant"), ("writer", "descendant"), ("probe", "descendant"), ("editor", "descendant")]
        assert tree(FAMILY).listing("probe", "descendants", lambda name: "idle") == []

    def test_the_tree_scope_lists_every_member_with_its_relationship_status_and_title(self) -> None:
        """Root and caller included, configuration order; another tree never."""
        status = {"lead": "in_turn"}.get
        listing = tree(FAMILY).listing("probe", "tree", lambda name: status(name) or "idle")
        assert listing == [
            {"name": "lead", "title": "Lead", "relationship": "ancestor", "status": "in_turn"},
            {"name": "scout", "title": "Scout", "relationship": "ancestor", "status": "idle"},
            {"name": "writer", "title": "Writer", "relationship": "sibling", "status": "idle"},
            {"name": "probe", "title": "Probe", "relationship": "self", "status": "idle"},
            {"name": "editor", "title": "Editor", "relationship": "sibling", "status": "idle"}]

    def test_only_an_agent_with_someone_in_its_tree_has_peers(self) -> None:
        built = tree(FAMILY)
        assert built.has_peers("probe") and not built.has_peers("solo") and not built.has_peers("ghost")
