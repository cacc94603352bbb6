"""Tests for mcplhost/speech/budget.py: a turn's publishes are bounded in number and never repeat (docs/agents.md#bounds)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.speech.budget import DUPLICATE, PUBLISH_CAP, PublishBudget
from mcplhost.speech.routing import Destination, Segment

ROOM = Destination(server_id="disc", channel_id="disc:room")
OTHER = Destination(server_id="disc", channel_id="disc:other", thread_id="t-1")

publishes = st.lists(st.tuples(st.sampled_from([ROOM, OTHER]), st.sampled_from(["hi", " hi\n", "bye", "x", "y", "z"])),
                     max_size=30)


class TestPublishBudget:
    def test_the_same_text_to_the_same_place_once_and_at_most_cap_in_all(self) -> None:
        budget = PublishBudget(2)
        assert budget.refusal(ROOM, "hi") is None
        budget.spend(ROOM, "hi")
        assert budget.refusal(ROOM, "  hi\n") == DUPLICATE  # surrounding whitespace does not make it new
        assert budget.refusal(OTHER, "hi") is None  # another destination may hear it
        budget.spend(OTHER, "hi")
        assert budget.refusal(ROOM, "more") == PUBLISH_CAP
        assert budget.refusal(ROOM, "hi") == DUPLICATE  # the more telling reason first
        assert budget.answer(PUBLISH_CAP)["reason"] == PUBLISH_CAP and "2" in budget.answer(PUBLISH_CAP)["detail"]

    def test_bounded_makes_drafts_of_what_is_past_a_bound_and_spends_nothing(self) -> None:
        budget = PublishBudget(2)
        segments = [Segment(text="a", destination=ROOM), Segment(text="a", destination=ROOM),
                    Segment(text="draft already", destination=None, reason="unknown"),
                    Segment(text="b", destination=ROOM), Segment(text="c", destination=OTHER)]
        kept = budget.bounded(segments)
        assert [(s.destination, s.reason, s.target) for s in kept] == [
            (ROOM, None, None), (None, DUPLICATE, ROOM), (None, "unknown", None), (ROOM, None, None),
            (None, PUBLISH_CAP, OTHER)]
        assert budget.spent == 0 and budget.refusal(ROOM, "a") is None

    @given(publishes, st.integers(1, 8))
    def test_one_at_a_time_or_all_at_once_the_same_are_kept(self, calls, cap) -> None:
        """Spending each accepted call in turn keeps exactly what `bounded` keeps of them all: at most `cap`, and
        no two the same."""
        budget = PublishBudget(cap)
        accepted = []
        for destination, text in calls:
            if budget.refusal(destination, text) is None:
                budget.spend(destination, text)
                accepted.append((destination, text))
        kept = PublishBudget(cap).bounded([Segment(text=t, destination=d) for d, t in calls])
        assert [(s.destination, s.text) for s in kept if s.destination is not None] == accepted
        assert len(accepted) <= cap and budget.spent == len(accepted)
        assert len({(d, t.strip()) for d, t in accepted}) == len(accepted)
