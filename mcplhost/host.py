"""Build everything from the validated config, whole, then run it in one task group.

    async with open_host(config, notifier=notifier, on_stored=view.items) as host:
        await host.run(stop, watchdog_s=watchdog_interval_s())

`open_host` assembles the host before anything runs: it opens the store,
builds the group writer, ingest (with its echo port, speech/echoes.py
`EchoMemory`), one outbox sender per connector and the agents runtime, and
hands back a `Host` whose every attribute is set. `Host.run` only starts
what was built, once; leaving the `async with` closes the store and the
`[inference]` backend, whether the host ran or not. A store that cannot be
opened raises from `open_host` itself (its `StoreError`), before any child
is spawned.

Shutdown order: on `stop`, the agents go first (a turn in progress is
aborted: its connectors hear lifecycle `aborted` and its record is written),
then the connectors (each runs its shielded
shutdown ladder, and in-flight requests finish their commits), then the
group writer commits what is still queued, then the store closes. So work a
connector was told is accepted is always on disk.

`Host.connectors` maps each configured connector's name to its
`ConnectorHandle`, built before anything starts and kept for the host's
life (after a stop each reads `stopped`); the speech router, agent tools and
status socket use those, never the supervisor's task group.

`Host.outbox_senders` maps each connector's name to its `OutboxSender`
(speech/outbox.py), built with the host and run beside the connectors
(stopped with them, before the group writer); a turn that queued a publish
calls its `notify()`.

`Host.control` answers the control socket (`mcplhost status`, `restart-connector`,
mcplhost/control/), served by `run` once the writer runs and before any
connector starts, and removed when `run` ends; `Host.status_line` sends
systemd's STATUS= line with the connectors counted by state after changes.

`Host.console` is the web console (mcplhost/console/), when `[console]
listen` is set: bound by `open_host`, served by `run` beside the control
socket, and stopped with the rest of the base group, after the connectors.

`Host.sharing` is this host's part in a shared PostgreSQL store (store/hosts.py;
None on SQLite): its row and heartbeats run in the base group, and each connector
starts only once its ownership lock is held; until then it stands by
(docs/operations.md#several-hosts-on-one-store). The agents runtime takes each
agent's lock the same way, and reads every host's items from the store
(agents/runtime.py). The host listens on the same session for the store's
notifications of publishes and peer messages (speech/shared.py, peers/service.py):
a publish queued on any host wakes this host's sender of its connector, and the
host also looks for pending rows every SHARED_POLL_S.

`Host.agents` is the agents runtime (agents/runtime.py); with no agent
configured it has no runners and is never run.

Stored events (`Stored(id, item)`, one per newly committed item) have one
consumer. With agents configured, the agents are it. Otherwise a caller (a
test, a tool) may pass `events=`, the sending end of
`stored_event_stream()` (mcplhost/ingest/service.py); the host closes it
when `run` ends, so the consumer sees the end of the stream once everything
is committed. Passing `events=` to a host with agents is refused
(HostStateError).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from types import MappingProxyType

import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from . import __version__
from .agents.inference import ConnectorInference, connector_inference
from .agents.reconfigure import close_backends
from .agents.runtime import AgentsRuntime
from .agents.turns.hooks import HookState
from .agents.turns.runner import CONTEXT_ROWS
from .agents.wiring import build_agents
from .config import (
    Config,
    ConnectorConfig,
    StoreConfig,
    connector_secret_sources,
    control_socket_path,
    default_host_name,
    secret_values,
    store_secret_values,
)
from .console import Console, FeedFormat, console_token
from .control.notify import StatusLine
from .control.responder import ControlService
from .control.server import serve_control
from .errors import ConfigError, HostStateError
from .inbound.mark import compile_patterns
from .ingest import Ingest, Stored, now_ms, stored_event_stream
from .ingest.quotas import QuotaLimits
from .logs import SuppressedTotals, redact_secrets
from .metrics import Metrics, Timings, bound_address
from .protocol.grants import IMPLEMENTED, offered_paths
from .reload import ReloadPlan, reload_plan
from .secrets import Secrets
from .speech.echoes import EchoMemory
from .speech.outbox import OutboxSender
from .speech.shared import serve_shared_outbox
from .store import NewItem, Pushes, Store, open_store
from .store.hosts import HostIdentity, Sharing
from .store.peers import PEER_CHANNEL
from .store.pushes import PUSH_DEDUP_WINDOW_MS
from .store.retention import run_retention
from .store.search_index import run_indexer
from .store.writer import GroupWriter
from .supervisor.handle import ConnectorHandle
from .supervisor.process import CHILD_PROCESSES, Launcher
from .supervisor.supervise import supervise
from .systemd import Notifier

log = structlog.get_logger()

#: How often old push-event dedup records are pruned.
PRUNE_INTERVAL_S = 3600.0


class Host:
    """A host built whole by `open_host` (or `build_host`); `run` it once."""

    def __init__(self, config: Config, *, store: Store, writer: GroupWriter, ingest: Ingest, hooks: HookState,
                 inference: ConnectorInference | None, connectors: Mapping[str, ConnectorHandle],
                 outbox_senders: Mapping[str, OutboxSender], agents: AgentsRuntime, notifier: Notifier,
                 control: ControlService, status_line: StatusLine,
                 agent_events: MemoryObjectReceiveStream[Stored] | None,
                 events: MemoryObjectSendStream[Stored] | None, metrics: Metrics | None = None,
                 new_connector: Callable[[ConnectorConfig], tuple[ConnectorHandle, OutboxSender]] | None = None,
                 handles: dict[str, ConnectorHandle] | None = None,
                 senders: dict[str, OutboxSender] | None = None, console: Console | None = None,
                 launcher: Launcher = CHILD_PROCESSES, sharing: Sharing | None = None) -> None:
        self.config = config
        self.store = store
        self.writer = writer
        self.ingest = ingest
        #: This host's hook and lifecycle bookkeeping: its agents write it, its connectors' inference/request
        #: reads it (the loop guard). Per host, never per process.
        self.hooks = hooks
        #: The `[inference]` backend connectors reach through inference/request and model/info (None: not configured).
        self.inference = inference
        #: name → the connector's live handle, one per configured connector for the host's whole life.
        self.connectors = connectors
        #: name → the connector's outbox sender.
        self.outbox_senders = outbox_senders
        self.agents = agents
        #: `/metrics` (None: `[metrics] listen` is not set); `metrics_address` is where it listens once running.
        self.metrics = metrics
        self.metrics_address: str | None = None
        #: The web console (None: `[console] listen` is not set); `console.address` once `open_host` bound it.
        self.console = console
        self.sharing = sharing
        self.notifier = notifier
        self.control = control
        self.status_line = status_line
        #: How each connector's process life starts and ends (supervisor/process.py): child processes.
        self.launcher = launcher
        self.ready = anyio.Event()
        # What a reload changes (docs/operations.md#reload): the dicts behind `connectors` and
        # `outbox_senders` (their read-only views stay the same objects for every reader), how a
        # connector's handle and sender are made, and each running connector's scope.
        self._new_connector = new_connector
        self._handles = handles if handles is not None else {}
        self._senders = senders if senders is not None else {}
        self._running: dict[str, tuple[anyio.CancelScope, anyio.Event]] = {}
        self._connector_group: TaskGroup | None = None
        self._agent_events = agent_events  # the agents' end of the Stored stream (None: no agent configured)
        self._events = events  # the sending end Ingest offers to; closed when `run` ends
        self._ran = False

    async def run(self, stop: anyio.Event, *, watchdog_s: float | None = None) -> None:
        """Run until `stop` is set, then stop gracefully (in the module docstring's order)."""
        if self._ran:
            raise HostStateError("a host runs once; open another with open_host")
        self._ran = True
        # Bound before anything starts: an address in use is the operator's to fix, said in one line.
        listen = self.config.metrics.listen  # set whenever there is a Metrics
        listener = await self.metrics.listen(listen) if self.metrics is not None and listen is not None else None
        try:
            async with anyio.create_task_group() as base:
                await base.start(self.writer.run)
                await base.start(partial(serve_control, redact=self.store.secrets.redact_bytes),
                                 control_socket_path(self.config), self.control.answer)
                if self.console is not None:
                    await base.start(self.console.run)
                if self.sharing is not None:  # registered before any connector asks for its lock
                    await base.start(self.sharing.run)
                    await base.start(partial(
                        serve_shared_outbox, self.sharing.listen, self.outbox_senders, self.store, self.writer,
                        self.owned_anywhere, {agent.name: agent.publish_max_age_s for agent in self.config.agents}))
                    if self.config.agents:  # peer entries any host queued for this host's agents
                        await self.sharing.listen(PEER_CHANNEL, self.agents.peers.heard)
                base.start_soon(self.status_line.run, self.notifier, self.connectors,
                                None if self.sharing is None else self.sharing.is_standby)
                if self.metrics is not None and listener is not None:
                    self.metrics_address = bound_address(listener)
                    base.start_soon(self.metrics.serve, listener)
                base.start_soon(_prune, self.store.pushes)
                base.start_soon(self._index_when_ready)
                if self.config.store.retention_days > 0:  # 0: items are kept for good (docs/operations.md#retention)
                    base.start_soon(partial(run_retention, self.store.retention,
                                            retention_days=self.config.store.retention_days,
                                            # shared: every host's agents (None: all with a cursor)
                                            agents=None if self.sharing is not None else
                                            [agent.name for agent in self.config.agents],
                                            context_rows=CONTEXT_ROWS, clock=now_ms))
                if watchdog_s is not None:
                    base.start_soon(_watchdog, self.notifier, watchdog_s)
                async with anyio.create_task_group() as connectors:
                    async with anyio.create_task_group() as agents:
                        if self._agent_events is not None:
                            # Cursors first: a new agent's starts at the end before any connector can add an item.
                            await agents.start(self.agents.run, self._agent_events)
                        self._connector_group = connectors
                        connectors.start_soon(self._start_all, connectors)
                        await stop.wait()
                        log.info("host.stopping")
                        self.notifier.send("STOPPING=1")
                        # Agents first: an aborted turn still tells its connectors (lifecycle) and is recorded.
                        agents.cancel_scope.cancel()
                    connectors.cancel_scope.cancel()
                base.cancel_scope.cancel()
        finally:
            self.close_events()
        log.info("host.stopped", **self.writer.stats)

    async def owned_anywhere(self) -> set[str]:
        """The connectors some live host sharing the store owns now, this one's included."""
        assert self.sharing is not None
        return {name for host in await self.sharing.live_hosts() for name in host.connectors} | set(self.sharing.owned)

    async def _index_when_ready(self) -> None:
        """The search index follows the items off the ack path, from once every connector's first start is done:
        a store migrated with items in it is indexed in the background, never before a connector is served
        (docs/operations.md#the-search-index)."""
        await self.ready.wait()
        await run_indexer(self.store.search_index)

    def close_events(self) -> None:
        """End the Stored stream: its consumer sees the end once everything is committed (idempotent)."""
        if self._events is not None:
            self._events.close()
        if self._agent_events is not None:
            self._agent_events.close()  # the agents closed their end if they ran; if not, nobody will read it

    async def _start_all(self, connectors: TaskGroup) -> None:
        """Start every connector at once; READY=1 once each finished its handshake or gave up."""
        async with anyio.create_task_group() as starting:
            for spec in self.config.connectors:
                starting.start_soon(self._start_one, connectors, spec)
        self.ready.set()
        log.info("host.ready", connectors=len(self.config.connectors))
        self.notifier.send("READY=1")

    async def _start_one(self, connectors: TaskGroup, spec: ConnectorConfig) -> None:
        await connectors.start(self._connector, spec)

    async def _connector(self, spec: ConnectorConfig, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                         ) -> None:
        """One connector and its outbox sender, under a scope of its own, so a reload can stop just it."""
        ended = anyio.Event()
        with anyio.CancelScope() as scope:
            self._running[spec.name] = (scope, ended)
            try:
                if self.sharing is not None:
                    if not await self.sharing.try_own(spec.name):
                        task_status.started()  # on standby: READY=1 does not wait for another host's connector
                        task_status = anyio.TASK_STATUS_IGNORED
                        self.status_line.changed()  # counted as standby from own()'s first step on, not as starting
                        await self.sharing.own(spec.name)
                    self.ingest.reseed_quota(spec.name)  # another host may have counted since this one last did
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.outbox_senders[spec.name].run)  # it waits for its connector to be ready
                    await tg.start(partial(supervise, handle=self.connectors[spec.name], launcher=self.launcher),
                                   spec, self.ingest)
                    task_status.started()
            finally:
                if self.sharing is not None:
                    with anyio.CancelScope(shield=True):
                        await self.sharing.release(spec.name)
                ended.set()

    async def reload(self, new: Config) -> ReloadPlan:
        """Apply a validated new config while running (SIGHUP): connectors added, removed and changed; agents.

        All or nothing: every connector handle and sender, every agent's
        backend, tools and prompt the new config needs is built first; a
        ConfigError (each problem named) leaves everything running as it was.
        Then: the new secrets are known, connectors stop and start (a changed
        one keeps its counts, as restart-connector does), and each agent takes
        its settings between two of its turns. An unchanged connector keeps its
        process. What a reload cannot change is logged and left as it runs
        (mcplhost/reload.py).
        """
        plan = reload_plan(self.config, new)
        for note in plan.notes:
            log.warning("host.reload_partial", detail=note)
        if self._connector_group is None or self._new_connector is None:
            log.warning("host.reload_skipped", detail="the host is not running its connectors")
            return plan
        built, problems = self._build(plan, new)
        try:
            agents = await self.agents.prepare_reload(new.agents)  # it closed what it built
        except ConfigError as exc:
            problems += exc.problems
            raise ConfigError(f"{len(problems)} problem(s)", problems=problems) from None
        if problems:
            await close_backends(agents.built())
            raise ConfigError(f"{len(problems)} problem(s)", problems=problems)
        install_secrets(new, self.store.secrets)  # before the changed connectors start: their new tokens are redacted
        try:
            await self._replace_connectors(plan, built)
        except BaseException:  # cancelled (the host stops): the agents' new backends are not handed over
            await close_backends(agents.built())
            raise
        self.ingest.set_quotas(connector_quotas(new))
        changed = await self.agents.apply_reload(agents)
        self.agents.set_connectors(new.connectors)  # author_line counts from the next compile
        self.config = msgspec.structs.replace(self.config, connectors=new.connectors, agents=self.agents.config.agents)
        log.info("host.reloaded", added=[s.name for s in plan.added], removed=list(plan.removed),
                 changed=[s.name for s in plan.changed], unchanged=list(plan.unchanged), agents_changed=changed)
        return plan

    def _build(self, plan: ReloadPlan, new: Config) -> tuple[dict[str, tuple[ConnectorHandle, OutboxSender]], list[str]]:
        """The handle and sender of each connector a reload starts, and a problem for each that cannot be built."""
        assert self._new_connector is not None
        built: dict[str, tuple[ConnectorHandle, OutboxSender]] = {}
        problems: list[str] = []
        for spec in (*plan.changed, *plan.added):
            built[spec.name] = self._new_connector(spec)  # objects only: a bug raises before anything is applied
        return built, problems

    async def _replace_connectors(self, plan: ReloadPlan, built: Mapping[str, tuple[ConnectorHandle, OutboxSender]]
                                  ) -> None:
        """Stop the removed and changed connectors, start the changed and added ones with what was built.

        A changed connector's new handle and sender continue the old ones'
        counts (restarts, refusals, last error, inbound and publish times,
        publishes by outcome), as one handle does across restart-connector.
        """
        assert self._connector_group is not None
        for name in plan.removed:
            await self._stop_connector(name)
        for spec in plan.changed:
            handle, sender = self.connectors[spec.name], self.outbox_senders[spec.name]
            await self._stop_connector(spec.name)
            built[spec.name][0].carry_over(handle)
            built[spec.name][1].stats = sender.stats  # mcplhost_publish_total goes on counting
        for spec in (*plan.changed, *plan.added):
            self._handles[spec.name], self._senders[spec.name] = built[spec.name]
            self._connector_group.start_soon(self._connector, spec)

    async def _stop_connector(self, name: str) -> None:
        """Stop one connector (its shutdown ladder, as at the host's stop) and forget it."""
        running = self._running.pop(name, None)
        if running is not None:
            scope, ended = running
            scope.cancel()
            await ended.wait()
        self._handles.pop(name, None)
        self._senders.pop(name, None)


def build_host(config: Config, store: Store, *, notifier: Notifier | None = None,
               on_stored: Callable[[list[NewItem]], None] | None = None,
               events: MemoryObjectSendStream[Stored] | None = None, feed_format: FeedFormat | None = None,
               console_token: str | None = None, launcher: Launcher = CHILD_PROCESSES,
               sharing: Sharing | None = None) -> Host:
    """Every part of the host over an open store, wired, nothing started (open_host opens and closes the store).

    `feed_format`: how the console's live feed reads (mcplhost/dev.py's lines, which the CLI passes); needed
    when `[console] listen` is set, with `console_token` (mcplhost/console/component.py `console_token`).
    `launcher`: how connectors start and stop (supervisor/process.py; child processes unless a test says otherwise).
    `sharing`: this host's part in a shared store (None: one host).
    """
    if config.agents and events is not None:
        raise HostStateError("stored events have one consumer; this host's agents take them")
    if config.console.listen and feed_format is None:
        raise HostStateError("the console's live feed needs its line format (mcplhost/dev.py's, from the CLI)")
    agent_events: MemoryObjectReceiveStream[Stored] | None = None
    if config.agents:
        events, agent_events = stored_event_stream()
    # The histograms exist only when /metrics is served; the counters are the components' own in any case.
    timings = Timings() if config.metrics.listen else None
    suppressed = SuppressedTotals()
    install_secrets(config, store.secrets)
    writer = GroupWriter(store, on_commit=timings.committed if timings is not None else None)
    ingest = Ingest(store, writer, log, echoes=EchoMemory(store.outbox), on_stored=on_stored, events=events,
                    suppressed=suppressed, quotas=connector_quotas(config), secrets=store.secrets)
    hooks = HookState()
    inference = connector_inference(config, secrets=store.secrets)
    offered = offered_paths(IMPLEMENTED, inference_configured=inference is not None)
    status_line = StatusLine()
    max_age_s = {agent.name: agent.publish_max_age_s for agent in config.agents}

    def new_connector(spec: ConnectorConfig) -> tuple[ConnectorHandle, OutboxSender]:
        def changed() -> None:
            status_line.changed()
            learn_connector_secrets(spec, store.secrets)  # its spawn re-reads the env file: so does the host, at each change

        handle = ConnectorHandle(spec, offered=offered, inference=inference, hooks=hooks,
                                 on_change=changed, suppressed=suppressed)
        if sharing is None:
            return handle, OutboxSender(store.outbox, writer, handle, max_age_s=max_age_s)
        return handle, OutboxSender(store.outbox, writer, handle, max_age_s=max_age_s,
                                    owned=partial(sharing.holds, spec.name))

    handles: dict[str, ConnectorHandle] = {}
    sender_of: dict[str, OutboxSender] = {}
    for spec in config.connectors:
        handles[spec.name], sender_of[spec.name] = new_connector(spec)
    senders = MappingProxyType(sender_of)
    connectors = MappingProxyType(handles)
    agents = build_agents(config, store, writer, connectors, outbox=senders, hooks=hooks, timings=timings,
                          sharing=sharing,
                          elsewhere=None if sharing is None else partial(_elsewhere, sharing, connectors))
    metrics = None if timings is None else Metrics(
        outbox=store.outbox, turns=store.turns, secrets=store.secrets, connectors=connectors, ingest=ingest, outbox_senders=senders,
        peer_admissions=lambda: agents.peers.admissions, suppressed=suppressed, timings=timings)
    control = ControlService(store, connectors, agents, started_at_ms=now_ms(), host_name=config.host.name,
                             sharing=sharing)
    console = None
    if config.console.listen and feed_format is not None:
        console = Console(config.console, token=console_token, store_path=config.store.url or Path(config.store.path),
                          secrets=store.secrets, operated=control,
                          agents=lambda: agents.config.agents, lines=feed_format,
                          connectors=[spec.name for spec in config.connectors])
        ingest.on_stored = _both(on_stored, console.stored)  # the console's feed reads after each commit too
    return Host(config, store=store, writer=writer, ingest=ingest, hooks=hooks, inference=inference,
                connectors=connectors, outbox_senders=senders, agents=agents,
                notifier=notifier if notifier is not None else Notifier(None, log),
                control=control, status_line=status_line,
                agent_events=agent_events, events=events, metrics=metrics, new_connector=new_connector,
                handles=handles, senders=sender_of, console=console, launcher=launcher, sharing=sharing)


def _elsewhere(sharing: Sharing, connectors: Mapping[str, ConnectorHandle], name: str) -> bool:
    """Whether another host runs connector `name`: this one is not configured for it, or stands by for it."""
    return name not in connectors or sharing.is_standby(name)


def _both(first: Callable[[list[NewItem]], None] | None,
          second: Callable[[list[NewItem]], None]) -> Callable[[list[NewItem]], None]:
    if first is None:
        return second

    def both(items: list[NewItem]) -> None:
        first(items)
        second(items)

    return both


def install_secrets(config: Config, secrets: Secrets) -> None:
    """The config's secret values into the store's `Secrets` (every holder shares it) and the log's redaction.

    Called when the host is built and on each reload (docs/agents.md#secrets).
    """
    secrets.update(secret_values(config))
    redact_secrets(secrets)


def learn_connector_secrets(spec: ConnectorConfig, secrets: Secrets) -> None:
    """Add the values of `spec`'s secret variables as they are now (an edited env file's new token)."""
    secrets.update({name: value for name, (value, _where) in connector_secret_sources(spec).items()})


def open_configured_store(store: StoreConfig) -> AbstractAsyncContextManager[Store]:
    """The store `[store]` names: the PostgreSQL server at `url` with its pool, else the SQLite file at `path`."""
    if store.url is not None:
        return open_store(store.url, pool_size=store.pool_size)
    return open_store(store.path, synchronous=store.synchronous)


def connector_quotas(config: Config) -> dict[str, QuotaLimits]:
    """Each connector's quotas, as ingest applies them (docs/operations.md#quotas)."""
    return {spec.name: QuotaLimits(spec.max_items_per_hour, spec.max_bytes_per_hour) for spec in config.connectors}


@asynccontextmanager
async def open_host(config: Config, *, notifier: Notifier | None = None,
                    on_stored: Callable[[list[NewItem]], None] | None = None,
                    events: MemoryObjectSendStream[Stored] | None = None,
                    feed_format: FeedFormat | None = None,
                    launcher: Launcher = CHILD_PROCESSES) -> AsyncIterator[Host]:
    """Open the store and build the host over it; on exit close the store, then the `[inference]` backend.

    `notifier`: systemd's (none: notifications go nowhere). `on_stored`: called
    after each commit with the items new in it (`mcplhost dev`'s live view).
    `events`: see the module docstring. `feed_format`, `launcher`: see `build_host`. The
    console, when configured, is bound here, before anything runs (its
    address is `host.console.address`), and closed on exit.
    """
    compile_patterns()  # derives the marking patterns' classes (~0.2 s) now, not on the first message
    inference: ConnectorInference | None = None
    try:
        # A console that cannot be served (its packages, its token file) stops the start before the store opens.
        token = console_token(config.console) if config.console.listen else None
        # The store's own secrets (a URL's password) are redacted from the log before the store opens: its
        # errors and log lines come before the host is built (build_host installs every secret).
        if config.store.url is not None:
            redact_secrets(Secrets(store_secret_values(config)))
        async with open_configured_store(config.store) as store, _sharing(config, store) as sharing:
            host = build_host(config, store, notifier=notifier, on_stored=on_stored, events=events,
                              feed_format=feed_format, console_token=token, launcher=launcher, sharing=sharing)
            inference = host.inference
            try:
                if host.console is not None:
                    host.console.bind()  # an address in use is the operator's to fix, said before anything starts
                yield host
            finally:
                if host.console is not None:
                    host.console.close()
                host.close_events()
                host.writer.close()  # a host that ran already drained it; one that never ran has nothing queued
    finally:
        if events is not None:
            events.close()  # also when the store could not be opened: the consumer must not wait forever
        if inference is not None:
            await inference.aclose()


@asynccontextmanager
async def _sharing(config: Config, store: Store) -> AsyncIterator[Sharing | None]:
    """This host's part in a shared PostgreSQL store, on a session connection of its own; None on SQLite."""
    if config.store.url is None:
        yield None
        return
    identity = HostIdentity(name=config.host.name or default_host_name(), pid=os.getpid(), version=__version__,
                            started_at=now_ms())
    async with store.session() as session:
        yield Sharing(session, identity)


async def _watchdog(notifier: Notifier, interval_s: float) -> None:
    """WATCHDOG=1 from the event loop itself, so the pings stop while the loop is stuck."""
    while True:
        notifier.send("WATCHDOG=1")
        await anyio.sleep(interval_s)


async def _prune(pushes: Pushes) -> None:
    while True:
        removed = await pushes.prune(now_ms() - PUSH_DEDUP_WINDOW_MS)
        if removed:
            log.info("store.pushes_pruned", removed=removed)
        await anyio.sleep(PRUNE_INTERVAL_S)
