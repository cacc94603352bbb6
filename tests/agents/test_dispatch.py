"""What the feed vouches was offered (mcplhost/agents/dispatch.py `Offered`), as a pure state: the cap on every cursor.

The runtime's behaviour through it (gaps, a bounded catch-up, ids out of order) is in tests/agents/test_runtime.py.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.agents.dispatch import RECENT_IDS, Offered

from ..properties import examples

#: One step: ("take", id) an event offered, or ("hold", id) an id known not offered (a gap, a bounded catch-up).
STEPS = st.lists(st.tuples(st.sampled_from(["take", "hold"]), st.integers(1, 60)), max_size=40)


class TestOffered:
    def test_an_id_at_or_below_the_start_s_end_or_offered_already_is_not_taken_again(self) -> None:
        offered = Offered()
        offered.start_end = 10
        assert not offered.take(10)
        assert offered.take(12) and not offered.take(12)
        assert offered.take(11)  # out of order, but never offered
        assert offered.through() == offered.seen_through() == 12

    def test_a_held_id_caps_what_is_seen_until_the_next_start(self) -> None:
        offered = Offered()
        offered.start_end = 5
        offered.hold_from(4)
        offered.take(9)
        assert offered.seen_through() == 3 and offered.through() == 9

    def test_the_recent_ids_are_bounded(self) -> None:
        offered = Offered()
        for item_id in range(1, RECENT_IDS + 10):
            offered.take(item_id)
        assert len(offered.recent) == RECENT_IDS

    @settings(max_examples=examples(100))
    @given(start_end=st.integers(0, 30), steps=STEPS)
    def test_seen_through_never_passes_a_held_or_unoffered_id(self, start_end: int,
                                                              steps: list[tuple[str, int]]) -> None:
        offered = Offered()
        offered.start_end = start_end
        taken: set[int] = set()
        held: list[int] = []
        for step, item_id in steps:
            if step == "take":
                assert offered.take(item_id) == (item_id > start_end and item_id not in taken)
                if item_id > start_end:
                    taken.add(item_id)
            else:
                offered.hold_from(item_id)
                held.append(item_id)
        seen = offered.seen_through()
        assert seen <= max([start_end, *taken])
        assert all(seen < item_id for item_id in held)
