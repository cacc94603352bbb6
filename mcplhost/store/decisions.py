"""Wake decisions kept for `mcplhost explain` (migration 0008, docs/agents.md#explain).

Only the decisions that hang on state the config and the ledgers cannot give
back later are written: the sender cap, the turn cap, the token budget, and
the pending wakes a stop command dropped. Everything else explain recomputes,
so the inbound path writes nothing for items that do not wake.

An item keeps its first decision per agent: a later one for the same pair is
ignored (the first is what held it).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

import msgspec

from mcplhost.store.connection import Connections

#: The reasons a decision row may carry (docs/agents.md#explain).
DECISION_REASONS = ("sender_cap", "turn_cap", "token_budget", "dropped_by_stop")
#: Rows per INSERT statement (SQLite's bound-parameter limit is far above 4 × this).
DECISIONS_PER_INSERT = 200


class WakeDecision(msgspec.Struct, frozen=True):
    """An item `agent` did not wake for, and the stateful rule that decided it."""

    item_id: int
    agent: str
    reason: str
    decided_at: int  # epoch ms

    def __post_init__(self) -> None:
        if self.reason not in DECISION_REASONS:
            raise ValueError(f"a wake decision's reason is one of {', '.join(DECISION_REASONS)}, "
                             f"not {self.reason!r}")
        if not self.agent:
            raise ValueError("a wake decision needs its agent's name")


class DecisionRepository:
    """Record and read wake decisions; the only code that knows the wake_decisions table."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def record_many_nocommit(self, decisions: Sequence[WakeDecision]) -> None:
        """Store each decision inside the caller's transaction; an (item, agent) already decided keeps its first."""
        conn = self._connections.writer("decisions.record_many_nocommit")
        for first in range(0, len(decisions), DECISIONS_PER_INSERT):
            chunk = decisions[first : first + DECISIONS_PER_INSERT]
            await conn.execute(
                "INSERT INTO wake_decisions (item_id, agent, reason, decided_at) VALUES "
                + ", ".join(["(?, ?, ?, ?)"] * len(chunk)) + " ON CONFLICT DO NOTHING",
                [v for d in chunk for v in (d.item_id, d.agent, d.reason, d.decided_at)],
            )

    async def for_item(self, item_id: int) -> builtins.list[WakeDecision]:
        """Every agent's recorded decision about one item, by agent name."""
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                "SELECT item_id, agent, reason, decided_at FROM wake_decisions WHERE item_id = ? ORDER BY agent",
                (item_id,))
        return [WakeDecision(*row) for row in rows]
