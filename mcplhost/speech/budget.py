"""How much one turn may publish (docs/agents.md#bounds): pure rules over a turn's publishes.

    budget = PublishBudget(agent.max_publishes_per_turn)
    reason = budget.refusal(destination, text)   # DUPLICATE, PUBLISH_CAP, or None: it may be queued
    segments = budget.bounded(segments)           # routed segments past either bound become drafts
    budget.spend(destination, text)               # once it is queued

A turn publishes at most `max_publishes_per_turn` segments (prose segments
and `channel_publish` calls alike), and the same text to the same
destination once: a model that repeats its last step, or answers with
thousands of calls, cannot flood a channel from one wake. "The same text"
is compared with surrounding whitespace removed. A publish past either bound
is never queued: `channel_publish` answers a refusal, prose becomes a draft.
"""

from __future__ import annotations

from collections.abc import Sequence

from mcplhost.speech.routing import Destination, Segment

#: The reason of a draft, and of a refused `channel_publish`, that repeats what the turn already published there.
DUPLICATE = "duplicate"
#: The reason of one past the turn's `max_publishes_per_turn`.
PUBLISH_CAP = "publish_cap"


def _same(text: str) -> str:
    """What "the same text" compares: the text without surrounding whitespace."""
    return text.strip()


class PublishBudget:
    """One turn's publishes so far: how many, and which text went to which destination."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.spent = 0
        self._said: set[tuple[Destination, str]] = set()  # at most `cap` entries

    def refusal(self, destination: Destination, text: str) -> str | None:
        """Why `text` may not be published to `destination` now (DUPLICATE, PUBLISH_CAP), or None."""
        return _refusal(destination, text, self._said, self.spent, self.cap)

    def spend(self, destination: Destination, text: str) -> None:
        """`text` was queued for `destination`: it counts, and the same text there is a duplicate from now on."""
        self._said.add((destination, _same(text)))
        self.spent += 1

    def bounded(self, segments: Sequence[Segment]) -> list[Segment]:
        """`segments` with each routed one past a bound made a draft (its reason, `target` where it was going).

        The ones kept count against each other (two equal segments: the
        second is a duplicate), but nothing is spent: `spend` what is queued.
        """
        said, spent = set(self._said), self.spent
        kept: list[Segment] = []
        for segment in segments:
            destination = segment.destination
            if destination is None:
                kept.append(segment)
                continue
            reason = _refusal(destination, segment.text, said, spent, self.cap)
            if reason is not None:
                kept.append(Segment(text=segment.text, destination=None, reason=reason, target=destination))
                continue
            said.add((destination, _same(segment.text)))
            spent += 1
            kept.append(segment)
        return kept

    def answer(self, reason: str) -> dict[str, str]:
        """`channel_publish`'s answer for a refusal of this budget: what it was, and that nothing was sent."""
        if reason == DUPLICATE:
            detail = "this turn already published the same text to that channel; not sent again"
        else:
            detail = f"this turn already published {self.cap} times (max_publishes_per_turn); not sent"
        return {"status": "refused", "reason": reason, "detail": detail}


def _refusal(destination: Destination, text: str, said: set[tuple[Destination, str]], spent: int,
             cap: int) -> str | None:
    if (destination, _same(text)) in said:
        return DUPLICATE
    if spent >= cap:
        return PUBLISH_CAP
    return None
