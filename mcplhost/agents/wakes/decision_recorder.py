"""Writing the stateful wake decisions for `mcplhost explain` (docs/agents.md#explain), off the inbound path.

The scheduler only reports what it held (`AgentScheduler.take_decisions`);
the runtime notes each report here without waiting, and `DecisionRecorder.run`
writes what gathered, one batch per write. A failed write is logged and the
batch dropped: explain then says `no_turn` for those items, never a wrong
rule. The buffer is bounded; past it the oldest notes are dropped and counted
in one log line.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import anyio
import structlog

from mcplhost.store.decisions import WakeDecision
from mcplhost.store.operations import RecordWakeDecisions
from mcplhost.store.writer import GroupWriter

log = structlog.get_logger()

#: Decisions waiting for their write, at most; past it the oldest are dropped.
MAX_UNWRITTEN_DECISIONS = 10_000


def decisions_of(agent: str, held: Iterable[tuple[int, str]], at: int) -> list[WakeDecision]:
    """The rows of one agent's report: (item id, reason) pairs, decided at `at` (epoch ms)."""
    return [WakeDecision(item_id, agent, reason, at) for item_id, reason in held]


async def record_now(writer: GroupWriter, decisions: list[WakeDecision]) -> None:
    """Write one batch of decisions; a failure is logged, never raised (the token budget's hold commits its own
    with the held turn's record instead, agents/turns/runner.py)."""
    if not decisions:
        return
    try:
        await writer.write(RecordWakeDecisions(decisions))
    except Exception:
        log.warning("agent.decisions_write_failed", decisions=len(decisions), exc_info=True)


class DecisionRecorder:
    """A bounded buffer of decisions and the task that writes them in batches."""

    def __init__(self, writer: GroupWriter, clock_ms: Callable[[], int]) -> None:
        self._writer = writer
        self._clock_ms = clock_ms
        self._buffer: deque[WakeDecision] = deque()
        self._ready = anyio.Event()
        self._dropped = 0

    def note(self, agent: str, held: list[tuple[int, str]]) -> None:
        """Queue one agent's report; never waits."""
        if not held:
            return
        self._buffer.extend(decisions_of(agent, held, self._clock_ms()))
        while len(self._buffer) > MAX_UNWRITTEN_DECISIONS:
            self._buffer.popleft()
            self._dropped += 1
        self._ready.set()

    async def run(self) -> None:
        """Write each gathered batch, forever."""
        while True:
            await self._ready.wait()
            self._ready = anyio.Event()
            if self._dropped:
                log.warning("agent.decisions_dropped", dropped=self._dropped, max_unwritten=MAX_UNWRITTEN_DECISIONS)
                self._dropped = 0
            batch = list(self._buffer)
            self._buffer.clear()
            await record_now(self._writer, batch)
