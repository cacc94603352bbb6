"""The agents' trees, from their `parent` chains only (docs/peers.md#trees); pure.

    tree = Tree(config.agents)
    tree.relation("scout", "lead")     # "ancestor": lead is scout's ancestor
    tree.listing("scout", "tree", status_of)

A relation is computed by the host from the configuration, never claimed by
a sender. `check-config` already refuses an unknown parent, a loop and a
tree deeper than MAX_TREE_DEPTH (mcplhost/config/rules.py); the walks here are
bounded by the same constant anyway, so a tree built from an unchecked
config still ends (a looping chain is then a tree of its own agent only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

from mcplhost.config import MAX_TREE_DEPTH, AgentConfig
from mcplhost.store import PeerRelationship

#: The target relative to the sender: the target is the sender's descendant, ancestor, or another member.
Relation = Literal["descendant", "ancestor", "sibling"]
#: A member relative to the caller of `task_list`.
Listed = Literal["self", "ancestor", "sibling", "descendant"]
#: `task_list` scopes: the caller's descendants (the default), or its whole tree.
SCOPES = ("descendants", "tree")

#: The sender's relation to the recipient (what a peer row's `metadata.peer.relationship` says), by the
#: target's relation to the sender: a message down the tree comes from an ancestor, and so on.
SENDER_RELATIONSHIP: dict[Relation, PeerRelationship] = {"descendant": "ancestor", "ancestor": "descendant", "sibling": "sibling"}


class Tree:
    """Every configured agent's parent and title; relations and listings between them."""

    def __init__(self, agents: Iterable[AgentConfig]) -> None:
        self._order: list[str] = []
        self._parent: dict[str, str | None] = {}
        self._title: dict[str, str | None] = {}
        for agent in agents:
            self._order.append(agent.name)
            self._parent[agent.name] = agent.parent
            self._title[agent.name] = agent.title
        self._chains = {name: self._walk(name) for name in self._order}

    def _walk(self, name: str) -> tuple[str, ...]:
        """`name`'s ancestors, nearest first; () for a chain that loops or names no agent past its end."""
        chain: list[str] = []
        cursor = self._parent.get(name)
        while cursor is not None:
            if cursor == name or cursor in chain or cursor not in self._parent or len(chain) >= MAX_TREE_DEPTH:
                return ()  # refused by check-config; alone here rather than guessed into a tree
            chain.append(cursor)
            cursor = self._parent[cursor]
        return tuple(chain)

    def __contains__(self, name: object) -> bool:
        return name in self._parent

    def title(self, name: str) -> str | None:
        return self._title.get(name)

    def ancestors(self, name: str) -> tuple[str, ...]:
        """Nearest first; the last is the root."""
        return self._chains.get(name, ())

    def root(self, name: str) -> str:
        chain = self.ancestors(name)
        return chain[-1] if chain else name

    def members(self, name: str) -> list[str]:
        """Every agent of `name`'s tree, root included, in configuration order."""
        root = self.root(name)
        return [other for other in self._order if self.root(other) == root]

    def has_peers(self, name: str) -> bool:
        """Whether `name` shares its tree with another agent (only then are the peer tools offered)."""
        return name in self and len(self.members(name)) > 1

    def relation(self, sender: str, target: str) -> Relation | None:
        """The target relative to the sender; None for the sender itself, another tree or an unknown name."""
        if sender == target or sender not in self or target not in self or self.root(sender) != self.root(target):
            return None
        if sender in self.ancestors(target):
            return "descendant"
        if target in self.ancestors(sender):
            return "ancestor"
        return "sibling"

    def listing(self, caller: str, scope: str, status: Callable[[str], str]) -> list[dict[str, str | None]]:
        """`task_list` rows `{name, title, relationship, status}`: the caller's descendants, or its whole tree."""
        rows: list[dict[str, str | None]] = []
        for name in self.members(caller):
            listed: Listed = "self" if name == caller else _listed(self.relation(caller, name))
            if scope != "tree" and listed != "descendant":
                continue
            rows.append({"name": name, "title": self._title[name], "relationship": listed, "status": status(name)})
        return rows


def _listed(relation: Relation | None) -> Listed:
    return relation if relation is not None else "sibling"
