"""Build everything from the validated config and run it in one task group.

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
(speech/outbox.py), built when the store opens and run beside the connectors
(stopped with them, before the group writer); a turn that queued a publish
calls its `notify()`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any

import anyio
import structlog
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from .agents.hooks import HookState
from .agents.inference import connector_inference
from .config import Config, ConnectorConfig
from .errors import HostStateError
from .inbound.patterns import fast_opening_re
from .ingest import STORED_EVENTS_BUFFER, Ingest, Stored, now_ms
from .protocol.grants import IMPLEMENTED, offered_paths
from .store import open_store
from .store.pushes import PUSH_DEDUP_WINDOW_MS
from .store.writer import GroupWriter
from .supervisor.handle import ConnectorHandle
from .supervisor.supervise import supervise
from .systemd import Notifier

log = structlog.get_logger()

#: How often old push-event dedup records are pruned.
PRUNE_INTERVAL_S = 3600.0


class Host:
    def __init__(self, config: Config, *, notifier: Notifier | None = None,
                 on_stored: Callable[[list[Any]], None] | None = None) -> None:
        self.config = config
        self.notifier = notifier
        self.on_stored = on_stored
        self.ready = anyio.Event()
        self.writer: GroupWriter | None = None
        self.ingest: Ingest | None = None  # set while running
        self._stored_send: ObjectSendStream[Stored] | None = None  # see stored_events()
        #: This host's hook and lifecycle bookkeeping: its agents write it, its connectors' inference/request
        #: reads it (the loop guard). Per host, never per process.
        self.hooks = HookState()
        #: The `[inference]` backend connectors reach through inference/request and model/info (None: not configured).
        self.inference = connector_inference(config)
        offered = offered_paths(IMPLEMENTED, inference_configured=self.inference is not None)
        self._handles = {spec.name: ConnectorHandle(spec, offered=offered, inference=self.inference, hooks=self.hooks)
                         for spec in config.connectors}
        #: name → the connector's live handle, one per configured connector for the host's whole life.
        self.connectors: Mapping[str, ConnectorHandle] = MappingProxyType(self._handles)
        #: The agents (set while running, when any is configured); they consume the Stored events.
        self.agents: Any = None
        self._senders: dict[str, Any] = {}
        #: name → the connector's outbox sender (set while running).
        self.outbox_senders: Mapping[str, Any] = MappingProxyType(self._senders)
        self._agent_events = self.stored_events() if config.agents else None

    def stored_events(self) -> ObjectReceiveStream[Stored]:
        """The stream of `Stored(id, item)` events, one per newly committed item; call before `run`.

        Bounded (STORED_EVENTS_BUFFER); a consumer that falls behind loses
        events, flagged by `missed_before` (mcplhost/ingest/service.py). Without a call there is
        no stream and no events.
        """
        if self._stored_send is not None:
            raise HostStateError("stored_events() has one consumer; it was already taken")
        self._stored_send, receive = anyio.create_memory_object_stream[Stored](STORED_EVENTS_BUFFER)
        return receive

    async def run(self, stop: anyio.Event, *, watchdog_s: float | None = None) -> None:
        """Run until `stop` is set, then stop gracefully."""
        config = self.config
        fast_opening_re()  # derives the marking pattern's classes (~0.2 s) now, not on the first message
        async with open_store(config.store.path, synchronous=config.store.synchronous) as store:
            self.writer = writer = GroupWriter(store)
            self.ingest = ingest = Ingest(store, writer, log, on_stored=self.on_stored, events=self._stored_send)
            self._build_senders(store, writer)
            async with anyio.create_task_group() as base:
                await base.start(writer.run)
                base.start_soon(self._prune, store)
                if watchdog_s is not None and self.notifier is not None:
                    base.start_soon(self._watchdog, watchdog_s)
                async with anyio.create_task_group() as connectors:
                    async with anyio.create_task_group() as agents:
                        if self._agent_events is not None:
                            # Cursors first: a new agent's starts at the end before any connector can add an item.
                            await agents.start(self._run_agents, store, writer, self._agent_events)
                        for sender in self._senders.values():  # each waits for its connector to be ready
                            connectors.start_soon(sender.run)
                        connectors.start_soon(self._start_all, connectors, ingest)
                        await stop.wait()
                        log.info("host.stopping")
                        if self.notifier is not None:
                            self.notifier.send("STOPPING=1")
                        # Agents first: an aborted turn still tells its connectors (lifecycle) and is recorded.
                        agents.cancel_scope.cancel()
                    connectors.cancel_scope.cancel()
                base.cancel_scope.cancel()
        if self.inference is not None:
            await self.inference.aclose()
        if self._stored_send is not None:
            self._stored_send.close()  # the consumer sees the end of the stream once everything is committed
        log.info("host.stopped", **(self.writer.stats if self.writer else {}))

    async def _run_agents(self, store: Any, writer: GroupWriter, events: ObjectReceiveStream[Stored], *,
                          task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        from .agents.runtime import AgentsRuntime  # only a host with agents loads them (and their SDKs)

        self.agents = AgentsRuntime(self.config, store, writer, self.connectors, events, outbox=self.outbox_senders,
                                    hooks=self.hooks)
        await self.agents.run(task_status=task_status)

    def _build_senders(self, store: Any, writer: GroupWriter) -> None:
        from .speech.outbox import OutboxSender

        max_age_s = {agent.name: agent.publish_max_age_s for agent in self.config.agents}
        self._senders.clear()
        for name, handle in self._handles.items():
            self._senders[name] = OutboxSender(store, writer, handle, max_age_s=max_age_s)

    async def _start_all(self, connectors: anyio.abc.TaskGroup, ingest: Ingest) -> None:
        """Start every connector at once; READY=1 once each finished its handshake or gave up."""
        async with anyio.create_task_group() as starting:
            for spec in self.config.connectors:
                starting.start_soon(self._start_one, connectors, spec, ingest)
        self.ready.set()
        log.info("host.ready", connectors=len(self.config.connectors))
        if self.notifier is not None:
            self.notifier.send("READY=1")

    async def _start_one(self, connectors: anyio.abc.TaskGroup, spec: ConnectorConfig, ingest: Ingest) -> None:
        await connectors.start(partial(supervise, handle=self._handles[spec.name]), spec, ingest)

    async def _watchdog(self, interval_s: float) -> None:
        assert self.notifier is not None
        while True:
            self.notifier.send("WATCHDOG=1")
            await anyio.sleep(interval_s)

    @staticmethod
    async def _prune(store: Any) -> None:
        while True:
            removed = await store.pushes.prune(now_ms() - PUSH_DEDUP_WINDOW_MS)
            if removed:
                log.info("store.pushes_pruned", removed=removed)
            await anyio.sleep(PRUNE_INTERVAL_S)
