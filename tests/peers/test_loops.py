"""The loop breaker's causes and count (mcplhost/peers/loops.py): pure."""

from __future__ import annotations

from typing import Any

import pytest

from mcplhost.peers.limits import CONSECUTIVE_WAKES_MAX
from mcplhost.peers.loops import held, item_cause, next_count, wake_cause
from mcplhost.store.items import StoredItem


def item(*, agent: str | None = None, text: str = "hi", peer: dict | None = None, kind: str = "channel",
         lane: str = "channels/incoming", item_id: int = 1) -> StoredItem:
    metadata: dict[str, Any] = {"source": {"kind": kind, "lane": lane}}
    if peer is not None:
        metadata = {"peer": peer}
    return StoredItem(id=item_id, role="user", content=[{"type": "text", "text": text}], metadata=metadata,
                      created_at=0, agent=agent, participant=None)


SPOKEN = {"Thanks, you too!": "writer"}.get


class TestCauses:
    @pytest.mark.parametrize(("waking", "cause"), [
        (item(agent="scout", peer={"from": "writer", "relationship": "sibling"}), "agent"),
        (item(agent="scout", peer={"from": "probe", "relationship": "descendant"}), "agent"),
        (item(agent="scout", peer={"from": "lead", "relationship": "ancestor"}), "parent"),
        (item(text="Thanks, you too!"), "agent"),          # another agent's speech coming back through chat
        (item(text="Thanks,   you too!"), "user"),        # the speaker lookup is the caller's (whitespace there)
        (item(text="hello"), "user"),
        (item(kind="surface", text="Thanks, you too!"), "user"),   # typed at the console
        (item(kind="unscoped", lane="push/event"), "other"),       # a timer
        (item(agent="writer", peer={"from": "x", "relationship": "sibling"}), "other"),  # another agent's row
    ])
    def test_each_item_says_who_caused_the_wake(self, waking: StoredItem, cause: str) -> None:
        assert item_cause("scout", waking, SPOKEN) == cause

    def test_its_own_speech_coming_back_is_not_another_agents(self) -> None:
        assert item_cause("writer", item(text="Thanks, you too!"), SPOKEN) == "user"

    def test_user_or_parent_input_wins_over_agents(self) -> None:
        peer = item(agent="scout", peer={"from": "writer", "relationship": "sibling"})
        assert wake_cause("scout", [peer, item(text="hello", item_id=2)], SPOKEN) == "user"
        assert wake_cause("scout", [peer, item(agent="scout", peer={"from": "lead", "relationship": "ancestor"})],
                          SPOKEN) == "parent"
        assert wake_cause("scout", [peer, item(kind="unscoped", lane="push/event")], SPOKEN) == "agent"
        assert wake_cause("scout", [item(kind="unscoped", lane="push/event")], SPOKEN) == "other"


class TestCount:
    def test_agents_count_up_user_and_parent_reset_pushes_leave_it(self) -> None:
        assert [next_count(2, cause) for cause in ("agent", "user", "parent", "other")] == [3, 0, 0, 2]

    def test_at_the_cap_a_wake_agents_alone_caused_is_held_unless_it_holds_admitted_peer_rows(self) -> None:
        cap = CONSECUTIVE_WAKES_MAX
        assert not held(cap - 1, "agent", admitted_peer_rows=False)
        assert held(cap, "agent", admitted_peer_rows=False)
        assert not held(cap, "agent", admitted_peer_rows=True)
        assert not held(cap + 5, "user", admitted_peer_rows=False)
