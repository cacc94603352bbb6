"""The stepped clock (tests/cli/clock.py) against the stubs' own client of it (connectors/mcpl_server.py
`timed_steps`): steps in the order of their times, one at a time, none before every party has come."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.connectors.mcpl_server import TEST_CLOCK_ENV, timed_steps

from ..properties import examples
from .clock import SteppedClock

#: Each party's waits, in whole seconds; party p's first wait also gets p/10, so no two steps share a time.
scenarios = st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=4), min_size=1, max_size=3)


def stepped(waits: list[list[int]]) -> tuple[list[tuple[str, int, int]], SteppedClock]:
    """Run one party per list of waits against a stepped clock; what each step saw, in order."""
    seen: list[tuple[str, int, int]] = []

    async def party(p: int, party_waits: list[int]) -> None:
        async with timed_steps() as steps:
            for k, wait in enumerate(party_waits):
                await steps.after(wait + (p / 10 if k == 0 else 0))
                seen.append(("start", p, k))
                await asyncio.sleep(0)  # the step's own work, during which the clock must not move
                seen.append(("end", p, k))

    async def parties() -> None:
        await asyncio.wait_for(asyncio.gather(*(party(p, w) for p, w in enumerate(waits))), 30)

    folder = Path(tempfile.mkdtemp(prefix="clock-"))
    with SteppedClock(folder / "clock.sock", parties=len(waits)) as clock:
        os.environ[TEST_CLOCK_ENV] = str(clock.path)
        try:
            asyncio.run(parties())
        finally:
            del os.environ[TEST_CLOCK_ENV]
    return seen, clock


class TestSteppedClock:
    @settings(max_examples=examples(25), deadline=None)
    @given(scenarios)
    def test_steps_come_in_the_order_of_their_times_each_after_the_one_before_has_ended(
            self, waits: list[list[int]]) -> None:
        seen, clock = stepped(waits)
        times = {(p, k): sum(w[: k + 1]) + p / 10 for p, w in enumerate(waits) for k in range(len(w))}
        expected = sorted(times, key=times.__getitem__)
        assert [(p, k) for what, p, k in seen if what == "start"] == expected
        assert seen == [(what, p, k) for p, k in expected for what in ("start", "end")]  # never two at once
        assert clock.now == max(times.values()) and not clock.impatient

    def test_nothing_moves_until_every_party_has_come(self) -> None:
        """A party that comes late with an early step still goes first: the clock waited for it."""
        seen: list[str] = []

        async def party(name: str, wait: float, late: float) -> None:
            await asyncio.sleep(late)
            async with timed_steps() as steps:
                await steps.after(wait)
                seen.append(name)

        async def both() -> None:
            await asyncio.wait_for(asyncio.gather(party("early-comer", 5, 0), party("late-comer", 1, 0.2)), 30)

        folder = Path(tempfile.mkdtemp(prefix="clock-"))
        with SteppedClock(folder / "clock.sock", parties=2) as clock:
            os.environ[TEST_CLOCK_ENV] = str(clock.path)
            try:
                asyncio.run(both())
            finally:
                del os.environ[TEST_CLOCK_ENV]
        assert seen == ["late-comer", "early-comer"]
