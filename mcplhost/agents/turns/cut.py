"""Where an over-long context is cut (docs/agents.md#compilation, Budget): pure arithmetic over units.

When a context exceeds `context_chars`, the oldest messages go in one
block, down to about 70% of the limit (`DROP_TO_SHARE`). The cut lands on
an anchor chosen by a unit's own first row id and size (`anchored_cut`),
so consecutive turns keep the same first message and prompt caches keep
working, whatever window of rows the store handed over.

The cut never takes what the turn is about (`kept_units`): when the block
would hold a waking item or a row the running turn wrote (its calls and
results), the other units (ambient) are dropped instead, oldest first, and
the waking items and the turn's own rows are kept newest first while they
fit; when the waking items alone do not, the newest are kept and the
request says how many are not shown (`left_out_note`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from operator import attrgetter

from mcplhost.agents.turns.history import HOST, Unit

#: What an over-long context is cut down to, as a share of `context_chars`.
DROP_TO_SHARE = 0.7
#: An anchor (see `anchored_cut`) must keep at least this share of the 70%; else the cut falls back to the plain rule.
ANCHOR_FLOOR_SHARE = 0.5
#: Knuth's multiplicative hash constant (2^32 / golden ratio), for anchors.
ANCHOR_HASH = 2654435761
#: Room kept for CUT_NOTE, the line the cut adds in front.
CUT_NOTE_RESERVE = 120
CUT_NOTE = f"{HOST}Earlier messages are not shown, to keep the context within its limit."
#: Room kept for the line saying how many waking messages did not fit (`left_out_note`).
LEFT_OUT_NOTE_RESERVE = 160

_unit_chars = attrgetter("chars")


def left_out_note(left_out: int, waking: int) -> str:
    """The line a request carries when the waking items alone exceed the budget: how many are not shown."""
    return (f"{HOST}{left_out} of the {waking} messages that woke you are not shown, to keep the context within "
            "its limit; the newest of them are.")


def kept_units(units: list[Unit], wake_ids: set[int], turn_id: int | None, *, high: int, low: int,
               spacing: float) -> tuple[list[Unit], int]:
    """The units a request keeps, oldest first, and how many waking items did not fit (see the module's docstring).

    `high` / `low`: the room for units (the limit, and 70% of it, less what else the request holds).
    """
    start = anchored_cut(units, high=high, low=low, spacing=spacing)
    if not any(_about(unit, wake_ids, turn_id) for unit in units[:start]):  # the common case: only what is cut
        return units[start:], 0
    about = [i for i, unit in enumerate(units) if _about(unit, wake_ids, turn_id)]
    return _keep_turn(units, about, wake_ids, turn_id, high=high, low=low, spacing=spacing)


def _about(unit: Unit, wake_ids: set[int], turn_id: int | None) -> bool:
    """Whether the turn is about the unit: it holds a waking item, or the running turn wrote it."""
    return (turn_id is not None and unit.turn == turn_id) or not wake_ids.isdisjoint(unit.item_ids)


def _own_turn(unit: Unit, turn_id: int | None) -> bool:
    return turn_id is not None and unit.turn == turn_id


def _keep_turn(units: list[Unit], about: list[int], wake_ids: set[int], turn_id: int | None, *, high: int, low: int,
               spacing: float) -> tuple[list[Unit], int]:
    """The units kept when the plain cut would drop what the turn is about; and how many waking items did not fit.

    First the running turn's own units, then the waking ones, each newest
    first while they fit under `high` (less room for the line saying how many
    did not: one message is at most a quarter of the limit, so the newest
    fits but with giant tools or hooks); then the ambient units (all the
    others) by the anchored cut in the room left, less the room for that
    line when it is there.
    """
    budget = high - LEFT_OUT_NOTE_RESERVE
    keep: set[int] = set()
    used = 0
    own = [i for i in about if _own_turn(units[i], turn_id)]
    mine = set(own)
    for group in (own, [i for i in about if i not in mine]):
        for index in reversed(group):
            if used + units[index].chars > budget:
                break
            keep.add(index)
            used += units[index].chars
    left_out = sum(len(wake_ids.intersection(units[i].item_ids)) for i in about if i not in keep)
    # The line saying how many did not fit takes its room from the ambient units too, not only from the kept ones.
    used_room = used + (LEFT_OUT_NOTE_RESERVE if left_out else 0)
    protected = set(about)
    ambient = [i for i in range(len(units)) if i not in protected]
    first = anchored_cut([units[i] for i in ambient], high=high - used_room, low=low - used_room, spacing=spacing)
    keep.update(ambient[first:])
    return [units[i] for i in sorted(keep)], left_out


def anchored_cut(units: list[Unit], *, high: int, low: int, spacing: float) -> int:
    """Index of the first unit kept: the oldest anchor whose units from there on fit under `high`.

    Whether a unit is an anchor depends on nothing but its own first row id
    and size (each character has the same chance, one in `spacing`), so the
    cut does not move with the window of rows the store hands over, nor
    from one turn to the next, until the context from the anchor overflows;
    then it jumps to the next anchor, on average `spacing` further on. An
    anchor that would keep less than `low` * ANCHOR_FLOOR_SHARE, or none
    at all, gives way to the plain rule: the oldest unit under `low`.
    """
    floor = low * ANCHOR_FLOOR_SHARE
    prefix = list(accumulate(map(_unit_chars, units), initial=0))  # prefix[i]: the chars of units[:i]
    total = prefix[-1]
    if total <= high:
        return 0
    # The chars of units[i:] (total - prefix[i]) only shrink as i grows: where they fit is a range of i.
    fits = bisect_left(prefix, total - high, 0, len(units))  # the first i whose units from there fit under high
    floored = bisect_right(prefix, total - floor, 0, len(units))  # the first i that keeps less than floor
    for index in range(fits, floored):
        if _is_anchor(units[index], spacing):
            return index
    return bisect_left(prefix, total - low, 0, len(units))  # the first i whose units fit under low


def _is_anchor(unit: Unit, spacing: float) -> bool:
    # Fibonacci hashing spreads consecutive ids evenly over [0, 1).
    draw = ((unit.item_ids[0] * ANCHOR_HASH) & 0xFFFFFFFF) / 2**32 if unit.item_ids else 1.0
    return draw * spacing < unit.chars
