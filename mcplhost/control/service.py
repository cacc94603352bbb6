"""What the daemon answers on its control socket, read from its components (docs/operations.md#status-and-the-control-socket).

Every figure comes from a component that already keeps it: the connector
handles' `statistics()`, the agents runtime's `statistics()`, the peer
service's queue counts and a few store reads. Nothing here counts anything.

Secrets never leave through the socket (docs/agents.md#secrets): the status
object is redacted whole as it is built, before anything is cut from it
for a `--check` line, and the server redacts every answer line it writes
(`serve_control(redact=...)`), as a log line is redacted in its values and
then whole.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec
import structlog

from mcplhost import __version__
from mcplhost.agents.runtime import AgentsRuntime
from mcplhost.config import default_host_name
from mcplhost.protocol.ports import ConnectorStopped
from mcplhost.store import Store, is_database_url
from mcplhost.store.hosts import LiveHost, Sharing, owner_in
from mcplhost.supervisor.handle import ConnectorHandle

from .status import (
    AgentCounts,
    HostEntry,
    HostStatus,
    Standby,
    Status,
    build_status,
    check_problems,
    sole_host,
)
from .wire import Answer, Request, RestartRequest, StatusRequest

log = structlog.get_logger()

_status_encoder = msgspec.json.Encoder()
_status_decoder = msgspec.json.Decoder(Status)
#: The window of an agent's `failedTurnsLastHour`.
HOUR_MS = 3_600_000


class ControlService:
    """Answers `status` and `restart-connector` for one host."""

    def __init__(self, store: Store, connectors: Mapping[str, ConnectorHandle], agents: AgentsRuntime, *,
                 started_at_ms: int, host_name: str | None = None, sharing: Sharing | None = None) -> None:
        self.store = store
        #: This host's part in a shared PostgreSQL store (None: it shares with none, as on SQLite).
        self.sharing = sharing
        self.connectors = connectors
        self.agents = agents
        self.started_at_ms = started_at_ms
        self.host_name = host_name or default_host_name()  # `[host] name`, resolved
        location = store.location  # a URL (its password as ***) is shown as the store gives it; a path absolute
        self._db = location if is_database_url(location) else os.path.abspath(location)

    async def status(self) -> Status:
        host = HostStatus(pid=os.getpid(), version=__version__, started_at=self.started_at_ms,
                          schema_version=await self.store.schema_version(), db=self._db,
                          db_bytes=await self.store.size_bytes())
        pending = await self.store.outbox.pending_by_agent()
        hour_ago = self.agents.clock_ms() - HOUR_MS
        counts = {}
        for name in self.agents.runners:
            health = await self.store.turns.health(name, hour_ago)  # the ledger's: a restart forgets nothing
            counts[name] = AgentCounts(queued_peer_messages=self.agents.peers.queued(name),
                                       drafts=await self.store.items.newest_turn_drafts(name),
                                       outbox_pending=pending.get(name, 0), last_error=health.last_error,
                                       failed_turns_last_hour=health.failed_since)
        hosts = [sole_host(self.host_name, host, self.connectors, self.agents.runners)]
        standby: dict[str, Standby] = {}
        agents_standby: dict[str, Standby] = {}
        if self.sharing is not None:
            live = await self.sharing.live_hosts()
            me = self.sharing.identity.name
            hosts = [_entry(row, answering=row.name == me) for row in live]
            standby = {name: Standby(owner_in(live, name, kind="connector", besides=me))
                       for name in self.connectors if self.sharing.is_standby(name)}
            agents_standby = {name: Standby(owner_in(live, name, kind="agent", besides=me))
                              for name in self.agents.runners if name in self.agents.standby}
        return self._redacted(build_status(host, (handle.statistics() for handle in self.connectors.values()),
                                           self.agents.statistics(), counts, hosts, standby, agents_standby))

    def _redacted(self, status: Status) -> Status:
        """`status` with every secret value in any of its strings replaced by `[redacted:NAME]` (one pass over its
        JSON: a connector's last error can hold its token)."""
        encoded = _status_encoder.encode(status)
        redacted = self.store.secrets.redact_bytes(encoded)
        return status if redacted is encoded else _status_decoder.decode(redacted)

    async def answer(self, request: Request) -> Answer:
        match request:
            case StatusRequest():
                status = await self.status()
                policies = {name: handle.spec.restart.policy for name, handle in self.connectors.items()}
                return Answer(ok=True, status=msgspec.Raw(_status_encoder.encode(status)),
                              problems=check_problems(status, policies))
            case RestartRequest(name=name):
                handle = self.connectors.get(name)
                if handle is None:
                    known = ", ".join(self.connectors) or "none"
                    return Answer(ok=False, error=f"no connector is named {name!r} (configured: {known})")
                if self.sharing is not None and self.sharing.is_standby(name):
                    owner = await self.sharing.owner_of(name)
                    return Answer(ok=False, error=f"{name!r} is on standby here: host {owner or '(unknown)'} runs it;"
                                                  " restart it there")
                try:
                    handle.restart()
                except ConnectorStopped as exc:
                    return Answer(ok=False, error=f"{exc}; restart the host to start it again")
                log.info("control.restart_connector", connector=name)
                return Answer(ok=True)


def _entry(row: LiveHost, *, answering: bool) -> HostEntry:
    """A live host's `hosts` entry; the answering host's heartbeat age is 0 (it is alive: it answers)."""
    return HostEntry(name=row.name, pid=row.pid, version=row.version, started_at=row.started_at,
                     heartbeat_age_ms=0 if answering else row.heartbeat_age_ms, connectors=row.connectors,
                     agents=row.agents)

