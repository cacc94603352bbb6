"""One agent's loop: its scheduler, its state, and the task that runs its turns one at a time (docs/agents.md#scheduling).

    runner = AgentRunner(agent, deps, state, seen_through, peers, recorder)   # built by agents/runtime.py
    runner.offer(stored, now)      # a stored item (or a peer row delivered between turns): it may wake the agent
    await runner.run()             # forever: sleep until the next deadline or nudge, run each due wake's turn

The runtime (agents/runtime.py) feeds every runner from the Stored stream
(agents/dispatch.py), catches each up at start (agents/startup.py) and
reloads them; each runner owns its agent's scheduler, its `AgentState`
and its durable cursor, and handles its wakes: a stop command on arrival,
a catch-up wake's wait for its routes, late echoes, the loop breaker, then
the turn (agents/turns/runner.py). `Running` is which runners run now, the
peer service's read-only view of them (mcplhost/peers/ports.py).

Exception boundaries: the loop (a bug pauses it RECOVER_S, never ends it),
and one per wake before its turn begins (a bug there fails that wake as a
turn); the turn's own is run_turn's.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
import structlog

from mcplhost.agents.model import Backend
from mcplhost.agents.tools.toolbox import ToolBox
from mcplhost.agents.turns.runner import record_failed_turn, run_turn
from mcplhost.agents.turns.turn_services import AgentState, TurnDeps
from mcplhost.agents.wakes.catchup import wait_for_routes
from mcplhost.agents.wakes.decision_recorder import DecisionRecorder
from mcplhost.agents.wakes.rules import NO_ADDRESSING, Addressing, Wake, without_late_echoes
from mcplhost.agents.wakes.scheduler import MAX_PENDING_IDS, AgentScheduler
from mcplhost.agents.wakes.stop import DROPPED_BY_STOP, is_stop_command
from mcplhost.config import AgentConfig
from mcplhost.ingest import Stored
from mcplhost.peers.loops import held, wake_cause
from mcplhost.peers.ports import Activity
from mcplhost.peers.service import PeerService
from mcplhost.store import NewItem, StoredItem
from mcplhost.store.decisions import WakeDecision
from mcplhost.store.operations import Operation, RecordWakeDecisions, SetCursor
from mcplhost.store.rows import PeerMeta

log = structlog.get_logger()

#: After an unexpected error in an agent's loop, how long it pauses before going on.
RECOVER_S = 1.0


class AgentRunner:
    """One agent: its scheduler, its backend and tools, and the task that runs its turns one at a time."""

    def __init__(self, agent: AgentConfig, deps: TurnDeps, state: AgentState, seen_through: Callable[[], int],
                 peers: PeerService, recorder: DecisionRecorder, addressing: Addressing = NO_ADDRESSING) -> None:
        self.agent = agent
        self._recorder = recorder  # where the scheduler's stateful holds go (docs/agents.md#explain)
        self.deps = deps  # the host's parts, shared by every agent
        self.state = state  # this agent's settings in force (a reload replaces them between turns)
        self.peers = peers
        self.scheduler = AgentScheduler(agent, addressing)
        self.cursor: int | None = None  # the durable cursor as last written
        self._seen_through = seen_through  # every item up to this id was offered (the runtime vouches)
        self._nudge = anyio.Event()
        #: Held while a wake is handled (its turn included): a reload waits on it, so settings change between turns.
        self._turn_lock = anyio.Lock()
        #: While a wake is handled: the scope a stop command cancels (docs/agents.md#stop).
        self._turn_scope: anyio.CancelScope | None = None
        self._stopping = False  # a stop cancelled the running turn: it ends stopped, not shut down
        self._dropped: list[int] = []  # items a stop dropped, their decisions not written yet
        #: The items pending in the scheduler as their events carried them (the newest MAX_PENDING_IDS): a
        #: wake reads its items from here, with no store read before its turn starts (the wake's latency).
        self._waking: OrderedDict[int, NewItem] = OrderedDict()
        self._stop_unwritten = False  # a stop happened: its decisions and the cursor are written next step

    def offer(self, stored: Stored, now: float) -> None:
        try:
            if is_stop_command(self.agent, stored.item):
                self._stop(stored.id, now)
                return
            woke = self.scheduler.on_item(stored, now)
            self._report_decisions()
        except Exception:  # a bug for one item must not stop the stream for every agent
            log.error("agent.offer_failed", agent=self.agent.name, item=stored.id, exc_info=True)
            return
        if woke:
            self._waking[stored.id] = stored.item
            if len(self._waking) > MAX_PENDING_IDS:
                self._waking.popitem(last=False)
            self._nudge.set()

    def _remembered(self, ids: tuple[int, ...]) -> list[StoredItem] | None:
        """The wake's items as their events carried them, by id (as `get_many` gives them), each forgotten now;
        None when one is not remembered (a catch-up wake, one past the bound): then all are read from the store."""
        items = [(item_id, self._waking.pop(item_id, None)) for item_id in sorted(set(ids))]
        if any(item is None for _, item in items):
            return None
        return [StoredItem(id=item_id, agent=item.agent, participant=item.participant, role=item.role,
                           content=item.content, metadata=item.metadata, created_at=item.created_at)
                for item_id, item in items if item is not None]

    def _stop(self, item_id: int, now: float) -> None:
        """A stop command on arrival: drop the pending wakes and abort the running turn (docs/agents.md#stop)."""
        dropped, counted_only = self.scheduler.drop_pending(now)
        self._dropped.extend(dropped)
        self._stop_unwritten = True
        scope = self._turn_scope
        running = scope is not None
        if scope is not None and not self._stopping:
            self._stopping = True
            scope.cancel()
        log.info("agent.stop", agent=self.agent.name, item=item_id, turn_aborted=running, dropped=len(dropped),
                 dropped_counted_only=counted_only)
        self._nudge.set()  # the runner writes the decisions and the cursor

    async def _write_stop(self) -> None:
        """After a stop: the dropped items' decisions and the cursor past them (and the stop), in one write."""
        dropped, self._dropped, self._stop_unwritten = self._dropped, [], False
        at = self.deps.clock_ms()
        decisions = [WakeDecision(item_id, self.agent.name, DROPPED_BY_STOP, at) for item_id in dropped]
        operations: list[Operation[Any]] = [RecordWakeDecisions(decisions)] if decisions else []
        operations.append(SetCursor(self.agent.name, self._cursor_after_turn(), at))
        await self.deps.writer.submit(*operations)

    def catch_up(self, events: list[Stored], now: float) -> None:
        events = [event for event in events if not is_stop_command(self.agent, event.item)]  # stale: wakes no one
        if events:
            self.scheduler.catch_up(events, now)
            self._nudge.set()

    async def run(self) -> None:
        """Sleep until the next deadline or nudge; run each due wake's turn; forever (a bug pauses, never ends it)."""
        while True:
            try:
                await self._step()
            except Exception:
                log.error("agent.runner_failed", agent=self.agent.name, exc_info=True)
                await anyio.sleep(RECOVER_S)

    async def _step(self) -> None:
        """Run the due wake's turn, or sleep until the next deadline or nudge."""
        async with self._turn_lock:
            if self._stop_unwritten:
                await self._write_stop()
            now = anyio.current_time()
            wake = self.scheduler.due(now)
            self._report_decisions()
            if wake is not None:
                try:
                    with anyio.CancelScope() as self._turn_scope:  # a stop cancels it (`_stop`)
                        await self._handle(wake)
                finally:
                    self._turn_scope, self._stopping = None, False
                    self.scheduler.turn_ended(anyio.current_time())
                    if self.deps.rows is not None:  # its rows are read now, off its next wake's path
                        self.deps.rows.turn_ended(self.agent.name)
                await self._deliver_peer_messages()
                return
        deadline = self.scheduler.next_deadline()
        delay = math.inf if deadline is None else max(0.0, deadline - now)
        with anyio.move_on_after(delay):
            await self._nudge.wait()
        self._nudge = anyio.Event()

    def _report_decisions(self) -> None:
        decided = self.scheduler.take_decisions()
        if decided:
            self._recorder.note(self.agent.name, decided)

    async def reconfigure(self, agent: AgentConfig, *, backend: Backend, toolbox: ToolBox, system_prompt: str) -> None:
        """Take new settings once the turn in progress (if any) has ended; the next wake uses them."""
        if self._turn_lock.locked():
            log.info("agent.reload_waits", agent=agent.name, detail="its turn in progress ends first")
        async with self._turn_lock:
            self.agent = agent
            self.scheduler.reconfigure(agent)
            self.state.backend = backend
            self.state.toolbox = toolbox
            self.state.system_prompt = system_prompt
        self._nudge.set()  # a shorter debounce may make a pending wake due now

    async def _handle(self, wake: Wake) -> None:
        """The wake's echo check and turn, one exception boundary: a bug here fails this wake, not the agent."""
        try:
            if wake.catch_up:
                await self._wait_for_routes(wake)
            kept, items = await self._without_late_echoes(wake)
            if kept is not None and await self._held_as_loop(kept, items):
                return
        except Exception as exc:  # only Exception: a cancellation (or a group holding one) goes through
            await record_failed_turn(self.agent, wake, self.deps, exc, cursor=self._cursor_after_turn)
            return
        if kept is None:
            return
        log.info("agent.wake", agent=self.agent.name, items=len(kept.item_ids), overflow=kept.overflow,
                 first_item=min(kept.item_ids, default=None),
                 conversations=len(kept.conversations), several_conversations=kept.several_conversations)
        if items:  # the wake latency: from its oldest item's acceptance to this turn's start
            oldest_ms = min(item.created_at for item in items)
            self.deps.timings.wake_started(max(0.0, (self.deps.clock_ms() - oldest_ms) / 1000))
        await run_turn(self.agent, kept, self.deps, self.state, cursor=self._cursor_after_turn, stopped=self._is_stopping)

    async def _wait_for_routes(self, wake: Wake) -> None:
        """A catch-up wake: wait until its connectors registered its items' channels, or gave up (wakes/catchup.py)."""
        items = await self.deps.store.items.get_many(wake.item_ids)
        started = anyio.current_time()
        missing = await wait_for_routes(self.deps.handles, items)
        waited = round(anyio.current_time() - started, 3)
        if missing:
            log.warning("agent.catch_up_unrouted", agent=self.agent.name, waited_s=waited, channels=missing[:10],
                        detail="their connectors have not registered these channels: a reply there is a draft")
        elif waited:
            log.info("agent.catch_up_routed", agent=self.agent.name, waited_s=waited)

    def _is_stopping(self) -> bool:
        """Asked by a cancelled turn: a stop (reason stopped, the cursor moves) rather than a shutdown."""
        return self._stopping

    def _cursor_after_turn(self) -> int:
        """The cursor to write with the running turn's end: its low-water mark, asked just before that write.

        Always given, even when it has not moved: the store keeps the larger
        (store/cursors.py), and a write that failed is made good by the next.
        """
        mark = self.scheduler.handled_through(self._seen_through(), turn_done=True)
        self.cursor = max(self.cursor or 0, mark)
        return mark

    async def _without_late_echoes(self, wake: Wake) -> tuple[Wake | None, list[StoredItem]]:
        """The wake without items now known as echoes (wakes/rules.py), and its items read; None, cursor moved past
        them, if none is left."""
        store = self.deps.store
        items = self._remembered(wake.item_ids)
        if items is None:
            items = await store.items.get_many(wake.item_ids)
        kept = without_late_echoes(wake, items, store.outbox.recent_delivered)
        if kept is wake:
            return wake, items
        log.info("agent.echoes_skipped", agent=self.agent.name,
                 echoes=len(wake.item_ids) - (len(kept.item_ids) if kept else 0), turn=kept is not None)
        if kept is None:
            await self._let_go()
            return None, items
        wanted = set(kept.item_ids)
        return kept, [item for item in items if item.id in wanted]

    async def _let_go(self) -> None:
        """A wake that runs no turn: the cursor moves past it."""
        await self.deps.writer.write(SetCursor(self.agent.name, self._cursor_after_turn(),
                                                   self.deps.clock_ms()))

    async def _held_as_loop(self, wake: Wake, items: list[StoredItem]) -> bool:
        """Count the wake by its cause (mcplhost/peers/loops.py); True when agents alone caused it past the cap.

        A held wake runs no turn and its cursor moves past it, like a wake of
        echoes only: its items stay in the context for the next turn a user
        or a parent causes.
        """
        name = self.agent.name
        cause = wake_cause(name, items, self.deps.store.outbox.recent_speaker)
        count = self.peers.consecutive_wakes(name)
        peer_rows = any(item.agent == name and isinstance(item.host, PeerMeta) for item in items)
        if held(count, cause, admitted_peer_rows=peer_rows):
            log.warning("agent.loop_held", agent=name, consecutive_wakes=count, items=len(wake.item_ids),
                        detail="agents alone woke this agent again and again; a user or its parent must speak")
            await self._let_go()
            return True
        await self.peers.turn_starting(name, cause)
        return False

    async def _deliver_peer_messages(self) -> None:
        """After a turn: deliver the peer messages queued meanwhile, and wake for them; a failure keeps them queued."""
        try:
            delivered = await self.peers.deliver_queued(self.agent.name)
        except Exception:  # the delivery's write (any store failure): the messages stay queued for the next turn end
            log.error("agent.peer_delivery_failed", agent=self.agent.name, exc_info=True)
            return
        now = anyio.current_time()
        for stored in delivered:
            self.offer(stored, now)


class Running:
    """Which agents run now and in what state: what peer messaging asks (mcplhost/peers/ports.py AgentActivity).

    Built before the peer service and the runtime (agents/wiring.py), shared by
    both: the runtime fills `runners` and says when it serves; the peer service
    only reads.
    """

    def __init__(self) -> None:
        self.runners: dict[str, AgentRunner] = {}
        self.serving = False  # the runners run (between start and shutdown): peers may reach them
        #: Agents another live host owns (a shared store): their runners run nothing here, as if inactive.
        self.standby: set[str] = set()

    def _running(self, name: str) -> AgentRunner | None:
        runner = self.runners.get(name)
        return None if runner is None or not self.serving or name in self.standby else runner

    def activity(self, name: str) -> Activity:
        runner = self._running(name)
        if runner is None:
            return "inactive"
        return "busy" if runner.scheduler.statistics().state == "in_turn" else "idle"

    def status(self, name: str) -> str:
        runner = self._running(name)
        return "inactive" if runner is None else runner.scheduler.statistics().state

    def wake(self, stored: Stored) -> None:
        """A peer row delivered between turns (returned by mcplhost/peers/service.py), offered to its agent only
        (`item.agent`: it wakes no other), when it runs here."""
        name = stored.item.agent or ""
        runner = self.runners.get(name)
        if runner is not None and name not in self.standby:
            runner.offer(stored, anyio.current_time())
