"""Each agent's start from its durable cursor (docs/agents.md#catch-up): at the runtime's start and at a take-over.

    startup = StartUp(running.runners, offered, running.standby, items=store.items, turns=store.turns,
                      cursors=store.cursors, outbox=store.outbox, writer=writer, clock_ms=clock_ms)
    await startup.start_cursors(mine, shared=False)     # agents/runtime.py `run`, before any agent runs
    await startup.take_over(runner)                     # its lock taken (agents/ownership.py): as a start does
    await warm(rows, running.runners, owned)            # beside the agents: their contexts read ahead

Catch-up: at start each agent wakes once for matching items after its
durable cursor younger than `catch_up_max_age_s`; an agent seen for the
first time gets a cursor at the current end of the store, written at once.
The start's end is what the dispatcher (agents/dispatch.py) vouches was
offered, unless the catch-up stopped short at CATCH_UP_MAX_ITEMS: the rest
holds every cursor below it until the next start.

An item handled while an older one pended is above the cursor (a low-water
mark), so the catch-up leaves out the items the ledger's newest finished
turns handled (`handled_above`) rather than waking for them twice. The
outbox's echo window is seeded before the catch-up, so a restart's wakes
know the publishes of before it.

The runaway guard survives a restart: each scheduler is seeded with the
start times of its agent's turns of the last hour from the turns ledger
(wall-clock ms turned into scheduler seconds relative to now), so
`max_turns_per_hour` holds a restarted agent until those turns age out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import anyio
import structlog

from mcplhost.agents.agent_loop import AgentRunner
from mcplhost.agents.dispatch import CATCH_UP_PAGE, Offered
from mcplhost.agents.turns.compiler import message_cap_of
from mcplhost.agents.turns.record import OUTCOME_COMPLETED, OUTCOME_FAILED, OUTCOME_HELD
from mcplhost.agents.turns.row_cache import RowCache
from mcplhost.agents.wakes.scheduler import HOUR_S
from mcplhost.ingest import Stored
from mcplhost.store.interfaces import Cursors, Items, Outbox, Turns
from mcplhost.store.operations import CloseUnfinishedTurns, StartCursor
from mcplhost.store.turns import REASON_STOPPED
from mcplhost.store.writer import GroupWriter

log = structlog.get_logger()

#: Most items the start's catch-up reads (for every agent at once); it then logs that it stopped short.
CATCH_UP_MAX_ITEMS = 200_000
#: An agent's newest turns read at start for items already handled above its cursor (older ones may wake again).
HANDLED_TURNS_READ = 1000
#: Turn outcomes that handled their wake (the cursor moves past it); an aborted turn's wake runs again,
#: unless a stop aborted it (its reason is REASON_STOPPED: the stop consumed it).
HANDLED_OUTCOMES = frozenset({OUTCOME_COMPLETED, OUTCOME_FAILED, OUTCOME_HELD})


class StartUp:
    """Reads each agent's cursor, turns and missed items from the store and gives them to its runner."""

    def __init__(self, runners: Mapping[str, AgentRunner], offered: Offered, standby: set[str], *, items: Items,
                 turns: Turns, cursors: Cursors, outbox: Outbox, writer: GroupWriter,
                 clock_ms: Callable[[], int]) -> None:
        self._runners = runners  # `Running.runners`: the runtime adds and removes agents in place
        self._offered = offered
        self._standby = standby  # `Running.standby`: an agent taken over leaves it here
        self._items = items
        self._turns = turns
        self._cursors = cursors
        self._outbox = outbox
        self._writer = writer
        self._clock_ms = clock_ms  # wall clock, epoch ms: the ledger's and the items' time

    async def start_cursors(self, mine: list[str], *, shared: bool) -> None:
        """Each of `mine`'s durable cursor: catch up after it, or start one at the current end for a new agent.

        Turns a killed host left running are closed as aborted first (on a
        shared store only `mine`'s); their wakes are after the cursor, so the
        catch-up runs them again.
        """
        scope = tuple(mine) if shared else None  # never another live host's turn in progress
        closed = await self._writer.write(CloseUnfinishedTurns(self._clock_ms(), agents=scope))
        if closed:
            log.info("agent.unfinished_turns_closed", turns=closed)
        await self.seed_turn_guards(mine)
        # The echo window from the outbox before any wake, so catch-up's wakes also know the recent publishes.
        await self._outbox.load_recent_delivered(self._clock_ms())
        end = await self._items.last_id()
        self._offered.start_end = end
        fresh: list[str] = []
        behind: dict[str, int] = {}  # agent → its cursor, for agents that have one
        for name in mine:
            runner = self._runners[name]
            cursor = await self._cursors.get(name)
            if cursor is None:
                fresh.append(name)
            else:
                runner.cursor = behind[name] = cursor
        await self.catch_up(behind, end, await self.handled_above(behind))
        if fresh:
            starts = {name: StartCursor(name, self._clock_ms()) for name in fresh}
            started = await self._writer.submit(*starts.values())
            for name, start in starts.items():
                self._runners[name].cursor = cursor = started[start]
                log.info("agent.cursor_started", agent=name, cursor=cursor)

    async def take_over(self, runner: AgentRunner) -> None:
        """An agent whose lock this host just took (agents/ownership.py): from its durable cursor, as a start does.

        It is offered every item after what was offered already from the moment it leaves standby (no await in
        between); the catch-up reads the rest, after its cursor, up to there. An item in both wakes once (the
        scheduler's pending and recent ids).
        """
        name = runner.agent.name
        closed = await self._writer.write(CloseUnfinishedTurns(self._clock_ms(), agents=(name,)))
        await self.seed_turn_guards([name])
        cursor = await self._cursors.get(name)
        through = self._offered.through()
        self._standby.discard(name)
        if cursor is None:
            runner.cursor = cursor = await self._writer.write(StartCursor(name, self._clock_ms()))
        else:
            runner.cursor = cursor
            await self.catch_up({name: cursor}, through, await self.handled_above({name: cursor}))
        log.info("agent.taken_over", agent=name, cursor=cursor, offered_through=through, turns_closed=closed)

    async def seed_turn_guards(self, names: list[str]) -> None:
        """Give each scheduler the turns its agent ran in the last hour (the ledger's), for max_turns_per_hour."""
        for name in names:
            runner = self._runners[name]
            at = self._clock_ms()
            started_ms = await self._turns.started_since(name, at - int(HOUR_S * 1000),
                                                         limit=runner.agent.max_turns_per_hour)
            if not started_ms:
                continue
            now = anyio.current_time()
            runner.scheduler.seed_turns([now - (at - started) / 1000 for started in started_ms], now)
            log.info("agent.turn_guard_seeded", agent=name, turns_last_hour=len(started_ms),
                     max_turns_per_hour=runner.agent.max_turns_per_hour)

    async def handled_above(self, cursors: dict[str, int]) -> dict[str, set[int]]:
        """Per agent, the item ids above its cursor that a finished turn already handled (from the ledger).

        The cursor is a low-water mark, so an item handled while an older one
        still pended is above it; catch-up leaves these out instead of waking
        for them twice. Bounded: the newest HANDLED_TURNS_READ turns of each.
        """
        handled: dict[str, set[int]] = {}
        for name, cursor in cursors.items():
            handled[name] = {item_id async for turn in self._turns.iterate(agent=name, limit=HANDLED_TURNS_READ)
                             if turn.outcome in HANDLED_OUTCOMES or turn.reason == REASON_STOPPED
                             for item_id in turn.wake_item_ids if item_id > cursor}
        return handled

    async def catch_up(self, cursors: dict[str, int], end: int, handled: dict[str, set[int]]) -> None:
        """Wake each agent once for the matching items after its cursor, younger than its catch_up_max_age_s.

        One pass over the store for every agent, page by page (each page goes
        to every agent and is then let go), bounded by CATCH_UP_MAX_ITEMS.
        Items in `handled` (a finished turn's) are left out.
        """
        at = self._clock_ms()
        since = {name: at - int(self._runners[name].agent.catch_up_max_age_s * 1000) for name in cursors
                 if self._runners[name].agent.catch_up_max_age_s > 0}
        counts = dict.fromkeys(cursors, 0)
        if since:
            after, read = min(cursors[name] for name in since), 0
            while after < end and read < CATCH_UP_MAX_ITEMS:
                page = await self._items.after_as_written(after, since_ms=min(since.values()), limit=CATCH_UP_PAGE)
                page = [(item_id, item) for item_id, item in page if item_id <= end]
                read += len(page)
                now = anyio.current_time()
                for name, oldest in since.items():
                    mine = [Stored(item_id, item) for item_id, item in page
                            if item_id > cursors[name] and item.created_at >= oldest and item_id not in handled[name]]
                    counts[name] += len(mine)
                    self._runners[name].catch_up(mine, now)
                if len(page) < CATCH_UP_PAGE:
                    break
                after = page[-1][0]
            if read >= CATCH_UP_MAX_ITEMS:
                log.warning("agent.catch_up_bounded", items=read, max_items=CATCH_UP_MAX_ITEMS, after=after)
                self._offered.hold_from(after + 1)  # the rest waits for the next start
        for name, cursor in cursors.items():
            log.info("agent.catch_up", agent=name, cursor=cursor, items=counts[name])


async def warm(rows: RowCache, runners: Mapping[str, AgentRunner], names: list[str]) -> None:
    """Read and render each agent's context before its first wake (turns/row_cache.py `warm`): a first turn
    that comes sooner reads it itself, as before. A failure leaves it to the first turn."""
    for name in names:
        runner = runners.get(name)
        if runner is None or runner.agent.context_scope == "conversation":
            continue
        try:
            await rows.warm(name, message_cap_of(runner.agent), runner.state.no_author_line)
        except Exception as exc:
            log.warning("agent.warm_failed", agent=name, error=str(exc))
            return
