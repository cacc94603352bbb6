"""`mcplhost_turns_total{agent,outcome}`: the turns ledger counted by outcome, read at each scrape.

The counts come from the ledger itself (store/turns.py `outcome_counts`),
so a restarted host reports every turn its database holds, as `mcplhost
turns` does, and never a count a restart reset. Finished turns below the
oldest running one never change again: `TurnTally` keeps their counts and
reads only what lies above them at the next scrape, so a scrape costs the
turns since the last one, not the whole ledger.
"""

from __future__ import annotations

from collections import Counter

from mcplhost.store.interfaces import Turns


class TurnTally:
    """The ledger's finished turns by (agent, outcome), kept up to date one scrape at a time."""

    def __init__(self) -> None:
        self._through = 0  # every turn up to this id has ended and is counted in `_settled`
        self._settled: Counter[tuple[str, str]] = Counter()

    async def read(self, turns: Turns) -> dict[tuple[str, str], int]:
        """The counts now: the settled ones plus the turns that ended above the oldest running one."""
        counts = await turns.outcome_counts(self._through)
        self._settled.update(counts.settled)
        self._through = counts.through
        return dict(self._settled + Counter(counts.unsettled))
