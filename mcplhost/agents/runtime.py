"""The agents at run time: one scheduler and one task per agent, fed by the core's `Stored` events.

    runtime = build_agents(config, store, writer, host.connectors, outbox=host.outbox_senders)  # agents/wiring.py
    await task_group.start(runtime.run, stored_events)

The dispatcher reads each `Stored` event and hands it to every agent's
`AgentScheduler` (pure, time as a parameter); it never waits for a turn, so
inbound storage and other agents are never held up by one agent. Each agent
has its own task that sleeps until its scheduler's next deadline (or a nudge
from the dispatcher), takes the due `Wake` and runs the turn (turns/runner.py). A
slow backend or a hung connector delays only that agent.

Catch-up (docs/agents.md#catch-up): at start each agent wakes once
for matching items after its durable cursor younger than
`catch_up_max_age_s`; an agent seen for the first time gets a cursor at the
current end of the store, written at once. When the event stream says events
were dropped (`missed_before`), the runtime reads the missing items from
the store (after the highest id it has seen) and feeds them like events.

The durable cursor is a low-water mark: written with each turn's end (or
when a wake of echoes only is let go), it is the scheduler's
`handled_through`, so it never passes an item still pending for that agent.
The runtime vouches for what was offered (`seen_through`): every id up to
the start's end (or as far as a bounded catch-up read) and every event since,
but never past a gap of dropped events not read back yet; a gap whose read
failed holds every cursor below it until the next start's catch-up. Events
of one commit can come out of id order, so the dispatcher takes everything
the stream holds as one batch and offers it in id order without a yield:
the writer wakes every caller of a commit at once, and each emits its events
before the dispatcher runs again, so the highest id offered never has an
unoffered waking item below it.
An item handled while an older one pended is above the cursor, so the
start's catch-up leaves out the items the ledger's newest finished turns
handled (`_handled_above`) rather than waking for them twice.

Stop commands (docs/agents.md#stop, mcplhost/agents/wakes/stop.py): a stop item
acts in `offer`, on arrival: the scheduler drops the pending wakes, the
running turn's cancel scope is cancelled (the turn, told it was a stop,
ends aborted with reason `stopped` and moves the cursor), and the runner
then records the dropped items' `dropped_by_stop` decisions and the cursor.

Exception boundary: an unexpected error while handling one wake (outside
the turn's own boundary in turns/runner.py) fails that wake as a turn (`failed`,
with its `turn-failed` notice); the agent goes on serving later wakes.
Cancellation always goes through.

Echoes (docs/agents.md#echoes): a wake's items are read once more when it fires and
those now known as this host's own delivered publishes are left out (an echo
can be stored before its publish is answered); a wake of echoes only is no
turn, and the cursor moves past it. The outbox's echo window is seeded before
the catch-up, so a restart's wakes know the publishes of before it.

The runaway guard survives a restart: at start each scheduler is seeded with
the start times of its agent's turns of the last hour from the turns ledger
(wall-clock ms turned into scheduler seconds relative to now), so
`max_turns_per_hour` holds a restarted agent until those turns age out.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream

from mcplhost.agents.model import Backend
from mcplhost.agents.reconfigure import AgentUpdate, build_backend, close_backend, close_backends
from mcplhost.agents.tools.toolbox import ToolBox
from mcplhost.agents.turns.compiler import connectors_without_author_line
from mcplhost.agents.turns.record import OUTCOME_COMPLETED, OUTCOME_FAILED, OUTCOME_HELD
from mcplhost.agents.turns.runner import record_failed_turn, run_turn
from mcplhost.agents.turns.turn_services import AgentState, TurnDeps
from mcplhost.agents.wakes.catchup import wait_for_routes
from mcplhost.agents.wakes.decision_recorder import DecisionRecorder
from mcplhost.agents.wakes.rules import NO_ADDRESSING, Addressing, Wake, addressing_of, without_late_echoes
from mcplhost.agents.wakes.scheduler import HOUR_S, AgentScheduler, SchedulerStats
from mcplhost.agents.wakes.stop import DROPPED_BY_STOP, is_stop_command
from mcplhost.config import AgentConfig, Config, ConnectorConfig, system_prompt_text, unset_api_key
from mcplhost.errors import ConfigError
from mcplhost.ingest import Stored
from mcplhost.peers.loops import held, wake_cause
from mcplhost.peers.ports import Activity
from mcplhost.peers.service import PeerService
from mcplhost.store import StoredItem
from mcplhost.store.decisions import WakeDecision
from mcplhost.store.operations import CloseUnfinishedTurns, Operation, RecordWakeDecisions, SetCursor, StartCursor
from mcplhost.store.rows import PeerMeta
from mcplhost.store.turns import REASON_STOPPED

log = structlog.get_logger()

#: Items read per page when catching up (at start, or after dropped events).
CATCH_UP_PAGE = 1000
#: Most items the start's catch-up reads (for every agent at once); it then logs that it stopped short.
CATCH_UP_MAX_ITEMS = 200_000
#: Item ids remembered as offered, so a gap's read never offers an item twice.
RECENT_IDS = 8192
#: After an unexpected error in an agent's loop, how long it pauses before going on.
RECOVER_S = 1.0
#: How long closing the backends may take on shutdown.
BACKEND_CLOSE_S = 5.0
#: An agent's newest turns read at start for items already handled above its cursor (older ones may wake again).
HANDLED_TURNS_READ = 1000
#: Turn outcomes that handled their wake (the cursor moves past it); an aborted turn's wake runs again,
#: unless a stop aborted it (its reason is REASON_STOPPED: the stop consumed it).
HANDLED_OUTCOMES = frozenset({OUTCOME_COMPLETED, OUTCOME_FAILED, OUTCOME_HELD})

#: Test seam, None in production: called with the agent's name and the wake just before the wake is
#: handled (its echo check and turn); a test sets it to raise there, standing in for a bug in that code.
test_fault_before_wake: Callable[[str, Wake], None] | None = None


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
            self._nudge.set()

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
            if test_fault_before_wake is not None:
                test_fault_before_wake(self.agent.name, wake)
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


class AgentsReload(msgspec.Struct, frozen=True):
    """What a reload changes among the agents, with everything it needs built (`AgentsRuntime.prepare_reload`)."""

    removed: list[str]  # agents gone from the config
    updates: list[AgentUpdate]  # running agents' new settings, in config order
    added: list[AgentRunner]  # new agents' runners, not started
    names: list[str]  # every configured agent, in config order

    @property
    def changed(self) -> list[str]:
        return [*self.removed, *(u.agent.name for u in self.updates), *(r.agent.name for r in self.added)]

    def built(self) -> list[Backend]:
        """Every backend this reload built (none is in use until `apply_reload` hands it over)."""
        return [u.backend for u in self.updates if u.backend is not None] + [r.state.backend for r in self.added]


class Running:
    """Which agents run now and in what state: what peer messaging asks (mcplhost/peers/ports.py AgentActivity).

    Built before the peer service and the runtime (agents/wiring.py), shared by
    both: the runtime fills `runners` and says when it serves; the peer service
    only reads.
    """

    def __init__(self) -> None:
        self.runners: dict[str, AgentRunner] = {}
        self.serving = False  # the runners run (between start and shutdown): peers may reach them

    def activity(self, name: str) -> Activity:
        runner = self.runners.get(name)
        if runner is None or not self.serving:
            return "inactive"
        return "busy" if runner.scheduler.statistics().state == "in_turn" else "idle"

    def status(self, name: str) -> str:
        runner = self.runners.get(name)
        if runner is None or not self.serving:
            return "inactive"
        return runner.scheduler.statistics().state

    def wake(self, stored: Stored) -> None:
        """A peer row delivered between turns (returned by mcplhost/peers/service.py), offered to its agent only
        (`item.agent`: it wakes no other)."""
        runner = self.runners.get(stored.item.agent or "")
        if runner is not None:
            runner.offer(stored, anyio.current_time())


class AgentsRuntime:
    """Every configured agent, fed from one `Stored` stream; `run` until cancelled.

    It receives the host's parts built (agents/wiring.py `build_agents`) and
    builds only each agent's runner and tools, at start and at a reload.
    """

    def __init__(self, config: Config, deps: TurnDeps, backends: Mapping[str, Backend], *, peers: PeerService,
                 running: Running, recorder: DecisionRecorder) -> None:
        self.config = config
        self.deps = deps
        self.clock_ms = deps.clock_ms  # wall clock, epoch ms: the ledger's and the items' time
        self.store = deps.store
        self.writer = deps.writer
        #: Peer messaging between this host's agents; `running` is its view of who is idle or busy.
        self.peers = peers
        self._running = running
        self.runners = running.runners
        self.decisions = recorder
        self._no_author_line = connectors_without_author_line(config.connectors)
        #: Whom addressed items address (docs/agents.md#addressing), from the connectors and agents configured.
        self.addressing = addressing_of(config.connectors, config.agents)
        for agent in config.agents:
            self.runners[agent.name] = self._runner(agent, backends[agent.name])
        #: While running: the group the runners run in, and each runner's scope (a reload stops one).
        self._group: TaskGroup | None = None
        self._runner_scopes: dict[str, anyio.CancelScope] = {}
        self._start_end = 0  # the store's last id at start: what catch-up covered
        #: Ids offered lately (events of concurrent requests may come out of id order), bounded.
        self._recent: OrderedDict[int, None] = OrderedDict()
        self._max_offered = 0
        #: The lowest id known not offered this run (a bounded catch-up's rest, a gap whose read failed):
        #: no cursor passes it before the next start's catch-up.
        self._unoffered: float = math.inf

    def _toolbox(self, agent: AgentConfig) -> ToolBox:
        return ToolBox(agent, self.deps.handles, self.store, peers=self.peers, woken=self._running.wake)

    def _runner(self, agent: AgentConfig, backend: Backend, prompt: str | None = None) -> AgentRunner:
        """One agent's runner with its state (`prompt`: its system prompt, read now when not given)."""
        state = AgentState(backend=backend, toolbox=self._toolbox(agent),
                           system_prompt=start_prompt(agent) if prompt is None else prompt,
                           no_author_line=self._no_author_line)
        return AgentRunner(agent, self.deps, state, self.seen_through, self.peers, self.decisions, self.addressing)

    def set_connectors(self, connectors: list[ConnectorConfig]) -> None:
        """A reload's connector tables: which of them show the `from:` line, and whom their addressed items address,
        count from every agent's next compile and offer."""
        self.config = msgspec.structs.replace(self.config, connectors=connectors)
        self._no_author_line = connectors_without_author_line(connectors)
        for runner in self.runners.values():
            runner.state.no_author_line = self._no_author_line
        self._readdress()

    def _readdress(self) -> None:
        """Whom addressed items address, again from the config in force (a reload's agents and connectors)."""
        self.addressing = addressing_of(self.config.connectors, self.config.agents)
        for runner in self.runners.values():
            runner.scheduler.addressing = self.addressing

    async def _run_runner(self, runner: AgentRunner) -> None:
        with anyio.CancelScope() as scope:
            self._runner_scopes[runner.agent.name] = scope
            await runner.run()

    def seen_through(self) -> int:
        """Every item up to this id has been offered to every scheduler (or decided for at start)."""
        offered = max(self._start_end, self._max_offered)
        return offered if self._unoffered > offered else int(self._unoffered) - 1

    async def reload(self, agents: list[AgentConfig]) -> list[str]:
        """Apply the configured agents' new settings in place (a config reload); the names changed.

        `prepare_reload`, then `apply_reload`: a ConfigError (every problem
        named) changes nothing.
        """
        return await self.apply_reload(await self.prepare_reload(agents))

    async def prepare_reload(self, agents: list[AgentConfig]) -> AgentsReload:
        """Build everything the new agent tables need, touching nothing that runs (agents/reconfigure.py).

        Every prompt is read again: an edited `system_prompt_file` is a
        changed agent. A changed backend table gets a new backend; a new agent
        (in a running runtime) its whole runner. Raises ConfigError listing
        every problem, after closing what was built.
        """
        problems: list[str] = []
        updates: list[AgentUpdate] = []
        added: list[AgentRunner] = []
        for i, agent in enumerate(agents):
            runner = self.runners.get(agent.name)
            try:
                prompt = start_prompt(agent)
                if runner is None:
                    if self._group is not None:  # a runtime that does not run starts no agent (mcplhost/reload.py)
                        added.append(self._runner(agent, build_backend(f"agents[{i}].backend", agent.backend), prompt))
                elif runner.agent != agent or runner.state.system_prompt != prompt:
                    backend = None if agent.backend == runner.agent.backend else \
                        build_backend(f"agents[{i}].backend", agent.backend)
                    updates.append(AgentUpdate(agent, prompt, backend,
                                               self._toolbox(agent)))
            except ConfigError as exc:  # start_prompt's names no path; build_backend's problem does
                problems += exc.problems or [f"agents[{i}].system_prompt_file: {exc.message} ({exc.explanation})"]
        wanted = {agent.name for agent in agents}
        plan = AgentsReload([name for name in self.runners if name not in wanted], updates, added,
                            [agent.name for agent in agents])
        if problems:
            await close_backends(plan.built())
            raise ConfigError(f"{len(problems)} agent problem(s)", problems=problems)
        return plan

    async def apply_reload(self, plan: AgentsReload) -> list[str]:
        """Hand a prepared reload over; the names changed.

        Each agent takes its settings once its turn in progress has ended; an
        agent gone stops then; a new one starts with a cursor at the store's
        end. Cancelled halfway (the host stops), the backends not handed over
        are closed.
        """
        unused = {id(backend): backend for backend in plan.built()}
        try:
            for name in plan.removed:
                await self._remove(name)
            for update in plan.updates:
                runner = self.runners[update.agent.name]
                old = runner.state.backend
                await runner.reconfigure(update.agent, backend=update.backend or old, toolbox=update.toolbox,
                                         system_prompt=update.prompt)
                if update.backend is not None:
                    unused.pop(id(update.backend))
                    warn_unset_key(update.agent)
                    await close_backends([old])
            for runner in plan.added:
                await self._add(runner)
                unused.pop(id(runner.state.backend))
        finally:
            await close_backends(unused.values())
        applied = [self.runners[name].agent for name in plan.names if name in self.runners]
        self.config = msgspec.structs.replace(self.config, agents=applied)
        self.peers.retree(applied)
        self._readdress()
        return plan.changed

    async def _add(self, runner: AgentRunner) -> None:
        """A new agent (a reload): its cursor starts at the store's end, like any agent seen for the first time."""
        name = runner.agent.name
        runner.cursor = await self.writer.write(StartCursor(name, self.clock_ms()))
        warn_unset_key(runner.agent)
        self.runners[name] = runner
        assert self._group is not None  # prepare_reload builds new runners only while the runtime runs
        self._group.start_soon(self._run_runner, runner, name=f"agent {name}")
        log.info("agent.added", agent=name, cursor=runner.cursor)

    async def _remove(self, name: str) -> None:
        """An agent gone from the config (a reload): stopped once its turn in progress has ended."""
        runner = self.runners[name]
        async with runner._turn_lock:
            scope = self._runner_scopes.pop(name, None)
            if scope is not None:
                scope.cancel()
            del self.runners[name]
        await close_backend(runner.state.backend, agent=name)
        log.info("agent.removed", agent=name)

    def statistics(self) -> dict[str, SchedulerStats]:
        """Each agent's scheduler state, for the status socket."""
        stats = {}
        for name, runner in self.runners.items():
            snapshot = runner.scheduler.statistics()
            if runner.state.budget_held and not snapshot.held:  # max_tokens_per_day holds it too
                snapshot = msgspec.structs.replace(snapshot, held=True)
            stats[name] = snapshot
        return stats

    async def run(self, stored: MemoryObjectReceiveStream[Stored], *,
                  task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the cursors and the agents, then offer every event of `stored` until cancelled or it ends."""
        for agent in self.config.agents:
            warn_unset_key(agent)
        try:
            async with anyio.create_task_group() as tg:
                await self._start_cursors()
                for row in await self.peers.start():  # after catch-up: what the queue held is delivered now
                    self._running.wake(row)
                self._group = tg
                if self.deps.acknowledger is not None:
                    tg.start_soon(self.deps.acknowledger.run, name="acknowledge")
                tg.start_soon(self.decisions.run, name="wake decisions")
                for runner in self.runners.values():
                    tg.start_soon(self._run_runner, runner, name=f"agent {runner.agent.name}")
                self._running.serving = True
                task_status.started()
                await self._dispatch(stored)
        finally:
            self._running.serving = False
            with anyio.CancelScope(shield=True), anyio.move_on_after(BACKEND_CLOSE_S):
                for runner in self.runners.values():
                    await close_backend(runner.state.backend, agent=runner.agent.name)
                if self.deps.moderator is not None:
                    await self.deps.moderator.aclose()

    async def _start_cursors(self) -> None:
        """Each agent's durable cursor: catch up after it, or start one at the current end for a new agent.

        Turns a killed host left running are closed as aborted first; their
        wakes are after the cursor, so the catch-up runs them again.
        """
        closed = await self.writer.write(CloseUnfinishedTurns(self.clock_ms()))
        if closed:
            log.info("agent.unfinished_turns_closed", turns=closed)
        await self._seed_turn_guards()
        # The echo window from the outbox before any wake, so catch-up's wakes also know the recent publishes.
        await self.store.outbox.load_recent_delivered(self.clock_ms())
        end = await self.store.items.last_id()
        self._start_end = end
        fresh: list[str] = []
        behind: dict[str, int] = {}  # agent → its cursor, for agents that have one
        for name, runner in self.runners.items():
            cursor = await self.store.cursors.get(name)
            if cursor is None:
                fresh.append(name)
            else:
                runner.cursor = behind[name] = cursor
        await self._catch_up(behind, end, await self._handled_above(behind))
        if fresh:
            starts = {name: StartCursor(name, self.clock_ms()) for name in fresh}
            started = await self.writer.submit(*starts.values())
            for name, start in starts.items():
                self.runners[name].cursor = cursor = started[start]
                log.info("agent.cursor_started", agent=name, cursor=cursor)

    async def _seed_turn_guards(self) -> None:
        """Give each scheduler the turns its agent ran in the last hour (the ledger's), for max_turns_per_hour."""
        for name, runner in self.runners.items():
            at = self.clock_ms()
            started_ms = await self.store.turns.started_since(name, at - int(HOUR_S * 1000),
                                                              limit=runner.agent.max_turns_per_hour)
            if not started_ms:
                continue
            now = anyio.current_time()
            runner.scheduler.seed_turns([now - (at - started) / 1000 for started in started_ms], now)
            log.info("agent.turn_guard_seeded", agent=name, turns_last_hour=len(started_ms),
                     max_turns_per_hour=runner.agent.max_turns_per_hour)

    async def _handled_above(self, cursors: dict[str, int]) -> dict[str, set[int]]:
        """Per agent, the item ids above its cursor that a finished turn already handled (from the ledger).

        The cursor is a low-water mark, so an item handled while an older one
        still pended is above it; catch-up leaves these out instead of waking
        for them twice. Bounded: the newest HANDLED_TURNS_READ turns of each.
        """
        handled: dict[str, set[int]] = {}
        for name, cursor in cursors.items():
            handled[name] = {item_id async for turn in self.store.turns.iterate(agent=name, limit=HANDLED_TURNS_READ)
                             if turn.outcome in HANDLED_OUTCOMES or turn.reason == REASON_STOPPED
                             for item_id in turn.wake_item_ids if item_id > cursor}
        return handled

    async def _catch_up(self, cursors: dict[str, int], end: int, handled: dict[str, set[int]]) -> None:
        """Wake each agent once for the matching items after its cursor, younger than its catch_up_max_age_s.

        One pass over the store for every agent, page by page (each page goes
        to every agent and is then let go), bounded by CATCH_UP_MAX_ITEMS.
        Items in `handled` (a finished turn's) are left out.
        """
        at = self.clock_ms()
        since = {name: at - int(self.runners[name].agent.catch_up_max_age_s * 1000) for name in cursors
                 if self.runners[name].agent.catch_up_max_age_s > 0}
        counts = dict.fromkeys(cursors, 0)
        if since:
            after, read = min(cursors[name] for name in since), 0
            while after < end and read < CATCH_UP_MAX_ITEMS:
                page = await self.store.items.after_as_written(after, since_ms=min(since.values()),
                                                               limit=CATCH_UP_PAGE)
                page = [(item_id, item) for item_id, item in page if item_id <= end]
                read += len(page)
                now = anyio.current_time()
                for name, oldest in since.items():
                    mine = [Stored(item_id, item) for item_id, item in page
                            if item_id > cursors[name] and item.created_at >= oldest and item_id not in handled[name]]
                    counts[name] += len(mine)
                    self.runners[name].catch_up(mine, now)
                if len(page) < CATCH_UP_PAGE:
                    break
                after = page[-1][0]
            if read >= CATCH_UP_MAX_ITEMS:
                log.warning("agent.catch_up_bounded", items=read, max_items=CATCH_UP_MAX_ITEMS, after=after)
                self._unoffered = min(self._unoffered, after + 1)  # the rest waits for the next start
        for name, cursor in cursors.items():
            log.info("agent.catch_up", agent=name, cursor=cursor, items=counts[name])

    async def _dispatch(self, stored: MemoryObjectReceiveStream[Stored]) -> None:
        """Offer each event; everything the stream holds at once is one batch, offered in id order."""
        async with stored:
            async for first in stored:
                for event in sorted([first, *_buffered(stored)], key=lambda e: e.id):
                    if event.missed_before:
                        try:
                            await self._fill_gap(event)
                        except Exception:  # the items stay after the cursors; the next start's catch-up has them
                            log.error("agent.events_gap_unfilled", missed=event.missed_before, exc_info=True)
                            self._unoffered = min(self._unoffered, max(self._max_offered, self._start_end) + 1)
                    self._offer(event)

    async def _fill_gap(self, event: Stored) -> None:
        """Events were dropped just before `event`: read those items from the store, page by page, and offer them.

        They are the ids between the highest offered and this event (an event
        of a concurrent request that came out of order and was dropped too is
        left to the next start's catch-up, from the durable cursor).
        """
        after, read = max(self._max_offered, self._start_end), 0
        while after < event.id - 1:
            page = await self.store.items.after_as_written(after, limit=CATCH_UP_PAGE)
            for item_id, item in page:
                if item_id < event.id:
                    read += 1
                    self._offer(Stored(item_id, item))
            if len(page) < CATCH_UP_PAGE:
                break
            after = page[-1][0]
        log.info("agent.events_gap_filled", missed=event.missed_before, read=read)

    def _offer(self, event: Stored) -> None:
        if event.id <= self._start_end or event.id in self._recent:
            return  # read by the start's catch-up (ids commit in order), or offered already
        self._recent[event.id] = None
        self._max_offered = max(self._max_offered, event.id)
        if len(self._recent) > RECENT_IDS:
            self._recent.popitem(last=False)
        now = anyio.current_time()
        for runner in self.runners.values():
            runner.offer(event, now)


def _buffered(stored: MemoryObjectReceiveStream[Stored]) -> list[Stored]:
    """The events already waiting in the stream (at most its buffer), taken without a yield."""
    events: list[Stored] = []
    while True:
        try:
            events.append(stored.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            return events


def warn_unset_key(agent: AgentConfig) -> None:
    """One warning when the agent's backend has no key to call with (docs/operations.md#when-an-agent-misbehaves)."""
    variable = unset_api_key(agent)
    if variable is not None:
        log.warning("agent.api_key_unset", agent=agent.name, variable=variable,
                    detail="every turn will fail with backend_error: missing_key until the variable is set "
                           "in the host's environment and the host restarted")


def start_prompt(agent: AgentConfig) -> str:
    """The agent's own prompt, read as the agents are built and again at each reload (an edited file is a changed
    agent, docs/operations.md#reload); ConfigError when the file cannot be read."""
    try:
        return system_prompt_text(agent)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"agent {agent.name}: cannot read system_prompt_file {agent.system_prompt_file}",
                          str(exc)) from None
