"""The agents at run time: one scheduler and one task per agent, fed by the core's `Stored` events.

    runtime = build_agents(config, store, writer, host.connectors, outbox=host.outbox_senders)  # agents/wiring.py
    await task_group.start(runtime.run, stored_events)

The dispatcher reads each `Stored` event and hands it to every agent's
`AgentScheduler` (pure, time as a parameter); it never waits for a turn, so
inbound storage and other agents are never held up by one agent. Each agent
has its own task that sleeps until its scheduler's next deadline (or a nudge
from the dispatcher), takes the due `Wake` and runs the turn (turns/runner.py). A
slow backend or a hung connector delays only that agent.

The start's catch-up from each agent's durable cursor, the turn guard's
seed and the warm-up of the contexts are agents/startup.py; the dispatcher,
which offers each event (and reads back dropped ones) and vouches for what
was offered (`Offered.seen_through`), is agents/dispatch.py. The durable
cursor is a low-water mark: written with each turn's end (or when a wake of
echoes only is let go), it is the scheduler's `handled_through`, capped by
what was offered, so it never passes an item still pending for that agent.

Stop commands (docs/agents.md#stop, mcplhost/agents/wakes/stop.py): a stop item
acts in `AgentRunner.offer` (agents/agent_loop.py), on arrival: the scheduler drops the pending wakes, the
running turn's cancel scope is cancelled (the turn, told it was a stop,
ends aborted with reason `stopped` and moves the cursor), and the runner
then records the dropped items' `dropped_by_stop` decisions and the cursor.

Each agent's own loop, its exception boundaries and its stop handling are
in agents/agent_loop.py.

On a shared PostgreSQL store (docs/operations.md#several-hosts-on-one-store) each agent
is run by one live host: the one holding its ownership lock (agents/ownership.py);
an agent another host owns stands by here until the lock comes free, and is
then taken over (agents/startup.py `take_over`): the turns the old owner left open closed, the
turn guard seeded, the durable cursor read from the store and caught up from
like a start (agents/startup.py), then it runs. And the agents' feed is then
the items table itself (agents/follow.py): each item is offered once, in id
order, whichever host stored it; this host's events only say when to read
(docs/architecture.md#engines).

Echoes (docs/agents.md#echoes): a wake's items are read once more when it fires and
those now known as this host's own delivered publishes are left out (an echo
can be stored before its publish is answered); a wake of echoes only is no
turn, and the cursor moves past it.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream

from mcplhost.agents.agent_loop import AgentRunner, Running
from mcplhost.agents.dispatch import Dispatcher, Offered
from mcplhost.agents.follow import ItemsFollower
from mcplhost.agents.model import Backend
from mcplhost.agents.ownership import Ownership
from mcplhost.agents.reconfigure import AgentUpdate, build_backend, close_backend, close_backends
from mcplhost.agents.startup import StartUp, warm
from mcplhost.agents.tools.toolbox import ToolBox
from mcplhost.agents.turns.compiler import connectors_without_author_line
from mcplhost.agents.turns.turn_services import AgentState, TurnDeps
from mcplhost.agents.wakes.decision_recorder import DecisionRecorder
from mcplhost.agents.wakes.rules import addressing_of
from mcplhost.agents.wakes.scheduler import SchedulerStats
from mcplhost.config import AgentConfig, Config, ConnectorConfig, system_prompt_text, unset_api_key
from mcplhost.errors import ConfigError
from mcplhost.ingest import Stored
from mcplhost.peers.service import PeerService
from mcplhost.store.hosts import Sharing
from mcplhost.store.operations import StartCursor
from mcplhost.store.order import ITEMS_CHANNEL

log = structlog.get_logger()

#: How long closing the backends may take on shutdown.
BACKEND_CLOSE_S = 5.0


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


class AgentsRuntime:
    """Every configured agent, fed from one `Stored` stream; `run` until cancelled.

    It receives the host's parts built (agents/wiring.py `build_agents`) and
    builds only each agent's runner and tools, at start and at a reload.
    """

    def __init__(self, config: Config, deps: TurnDeps, backends: Mapping[str, Backend], *, peers: PeerService,
                 running: Running, recorder: DecisionRecorder, sharing: Sharing | None = None) -> None:
        self.config = config
        self.deps = deps
        self.clock_ms = deps.clock_ms  # wall clock, epoch ms: the ledger's and the items' time
        self.store = deps.store
        self.writer = deps.writer
        #: Peer messaging between this host's agents; `running` is its view of who is idle or busy.
        self.peers = peers
        self._running = running
        self.runners = running.runners
        #: This host's part in a shared store (None: SQLite, one daemon): agent ownership and the items feed.
        self.sharing = sharing
        #: The agents another live host owns: runners with no task, offered nothing (`Running.standby`).
        self.standby = running.standby
        #: Which agents this host runs on a shared store, and standing by for the others (agents/ownership.py).
        self.ownership = Ownership(sharing, self.standby)
        self.decisions = recorder
        self._no_author_line = connectors_without_author_line(config.connectors)
        #: Whom addressed items address (docs/agents.md#addressing), from the connectors and agents configured.
        self.addressing = addressing_of(config.connectors, config.agents)
        #: What was offered to every scheduler this run: what the runners' cursors may pass (agents/dispatch.py).
        self.offered = Offered()
        self.dispatcher = Dispatcher(self.store.items, self.offered, self.runners, self.standby, rows=deps.rows)
        self.startup = StartUp(self.runners, self.offered, self.standby, items=self.store.items, turns=self.store.turns,
                               cursors=self.store.cursors, outbox=self.store.outbox, writer=self.writer,
                               clock_ms=self.clock_ms)
        for agent in config.agents:
            self.runners[agent.name] = self._runner(agent, backends[agent.name])
        #: While running: the group the runners run in, and each runner's scope (a reload stops one).
        self._group: TaskGroup | None = None
        self._runner_scopes: dict[str, anyio.CancelScope] = {}

    def _toolbox(self, agent: AgentConfig) -> ToolBox:
        return ToolBox(agent, self.deps.handles, self.store, peers=self.peers, woken=self._running.wake)

    def _runner(self, agent: AgentConfig, backend: Backend, prompt: str | None = None) -> AgentRunner:
        """One agent's runner with its state (`prompt`: its system prompt, read now when not given)."""
        state = AgentState(backend=backend, toolbox=self._toolbox(agent),
                           system_prompt=start_prompt(agent) if prompt is None else prompt,
                           no_author_line=self._no_author_line)
        return AgentRunner(agent, self.deps, state, self.offered.seen_through, self.peers, self.decisions, self.addressing)

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

    async def _run_runner(self, runner: AgentRunner, *, owned: bool = True) -> None:
        """The runner's task; `owned` False: stand by until its lock is taken, then take it over first."""
        name = runner.agent.name
        with anyio.CancelScope() as scope:
            self._runner_scopes[name] = scope
            try:
                if not owned:
                    await self.ownership.stand_by(runner, self.startup.take_over)
                await runner.run()
            finally:
                await self.ownership.let_go(name)

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
        owned = True
        if self.sharing is None:
            runner.cursor = await self.writer.write(StartCursor(name, self.clock_ms()))
        else:  # on a shared store it may have a cursor (and an owner) already
            self.standby.add(name)  # offered nothing before its cursor is read
            self.runners[name] = runner
            owned = bool(await self.ownership.claim([name]))
            if owned:
                await self.startup.take_over(runner)
        warn_unset_key(runner.agent)
        self.runners[name] = runner
        assert self._group is not None  # prepare_reload builds new runners only while the runtime runs
        self._group.start_soon(partial(self._run_runner, runner, owned=owned), name=f"agent {name}")
        log.info("agent.added", agent=name, cursor=runner.cursor, standby=not owned)

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
                owned = await self.ownership.claim(list(self.runners))
                mine = [name for name in self.runners if name not in self.standby]
                await self.startup.start_cursors(mine, shared=self.sharing is not None)
                for row in await self.peers.start():  # after catch-up: what the queue held is delivered now
                    self._running.wake(row)
                self._group = tg
                if self.deps.acknowledger is not None:
                    tg.start_soon(self.deps.acknowledger.run, name="acknowledge")
                tg.start_soon(self.decisions.run, name="wake decisions")
                if self.peers.shared:  # entries other hosts queued for this host's agents (peers/service.py)
                    tg.start_soon(self.peers.deliver_shared, self._running.wake, name="peers across hosts")
                for name, runner in self.runners.items():
                    tg.start_soon(partial(self._run_runner, runner, owned=name in owned), name=f"agent {name}")
                self._running.serving = True
                if self.deps.rows is not None:  # each agent's context read and rendered, and kept read after turns
                    tg.start_soon(self.deps.rows.run, name="agents' rows")
                    tg.start_soon(self.deps.rows.render_ahead, name="agents' rows rendered")
                    tg.start_soon(warm, self.deps.rows, self.runners, owned, name="warm contexts")
                if self.sharing is not None:  # every host's items, from the store (agents/follow.py)
                    follower = ItemsFollower(self.store.items, after=self.offered.start_end,
                                             offer=self.dispatcher.offer)
                    self.dispatcher.follower = follower
                    await self.sharing.listen(ITEMS_CHANNEL, follower.heard)
                    tg.start_soon(follower.run, name="follow items")
                task_status.started()
                await self.dispatcher.run(stored)
        finally:
            self._running.serving = False
            with anyio.CancelScope(shield=True), anyio.move_on_after(BACKEND_CLOSE_S):
                for runner in self.runners.values():
                    await close_backend(runner.state.backend, agent=runner.agent.name)
                if self.deps.moderator is not None:
                    await self.deps.moderator.aclose()



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
