"""The status object, its table, the `--check` verdict and the STATUS= line, all pure
(docs/operations.md#status-and-the-control-socket).

The object's names and order are the public surface (README.md#commands):
`host`, `connectors`, `agents`, each field built from one component's
`statistics()` snapshot or one store count; nothing here keeps a count
of its own.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from mcplhost.agents.wakes.scheduler import SchedulerStats
from mcplhost.protocol.ports import State
from mcplhost.supervisor.handle import ConnectorStatistics


class _Camel(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Field order is the JSON's key order.

    Each subclass says frozen=True again: msgspec inherits it, type checkers (PEP 681) do not.
    """


class HostStatus(_Camel, frozen=True):
    pid: int
    version: str
    started_at: int  # epoch ms
    schema_version: int  # the newest migration applied
    db: str  # absolute
    db_bytes: int  # the file and its WAL


class ConnectorStatus(_Camel, frozen=True, omit_defaults=True):
    name: str
    state: str
    pid: int | None
    restarts: int
    last_error: str | None
    last_inbound_at: int | None
    last_publish_at: int | None
    channels: int
    grant: list[str]  # sorted
    quiet: bool
    owner: str | None = None  # a `standby` connector's owning host (absent otherwise: SQLite's object is unchanged)


class AgentStatus(_Camel, frozen=True, omit_defaults=True):
    name: str
    state: str  # idle | debouncing | in_turn | standby
    pending_wakes: int
    queued_peer_messages: int
    drafts: int  # draft rows of its newest turn
    outbox_pending: int
    turns_last_hour: int
    held: bool
    last_error: str | None  # "reason: cause" of its newest failed turn, until a later turn completes
    failed_turns_last_hour: int
    owner: str | None = None  # a `standby` agent's owning host (absent otherwise: SQLite's object is unchanged)


class HostEntry(_Camel, frozen=True):
    """One host sharing the store, and what it runs (docs/operations.md#the-status-fields)."""

    name: str  # its [host] name
    pid: int  # that daemon's pid, on its machine
    version: str
    started_at: int  # epoch ms
    heartbeat_age_ms: int  # 0 for the host answering
    connectors: list[str]  # the connectors it owns, by name
    agents: list[str]  # the agents it owns, by name


class Status(msgspec.Struct, frozen=True, kw_only=True):
    host: HostStatus
    connectors: list[ConnectorStatus]
    agents: list[AgentStatus]
    hosts: list[HostEntry] = []  # an answer of a daemon older than the list decodes as none


class AgentCounts(msgspec.Struct, frozen=True):
    """What the store and the peer queue count for one agent (the turns ledger's health included)."""

    queued_peer_messages: int = 0
    drafts: int = 0
    outbox_pending: int = 0
    last_error: str | None = None
    failed_turns_last_hour: int = 0


#: A connector or agent this host is configured for while another live host owns it (a shared PostgreSQL
#: store): not a state of the handle's life (protocol/ports.py `State`) nor of a scheduler's, only of the status
#: object.
STANDBY = "standby"


class Standby(msgspec.Struct, frozen=True):
    """A connector or agent on standby here, and the live host that owns it (None: not known yet)."""

    owner: str | None


def connector_status(stats: ConnectorStatistics, standby: Standby | None = None) -> ConnectorStatus:
    if standby is not None:  # not run here: no process, no quiet verdict of its own
        return ConnectorStatus(
            name=stats.name, state=STANDBY, pid=None, restarts=stats.restarts, last_error=stats.last_error,
            last_inbound_at=stats.last_inbound_at, last_publish_at=stats.last_publish_at, channels=0,
            grant=sorted(stats.grant), quiet=False, owner=standby.owner)
    return ConnectorStatus(
        name=stats.name, state=stats.state.value, pid=stats.pid, restarts=stats.restarts,
        last_error=stats.last_error, last_inbound_at=stats.last_inbound_at, last_publish_at=stats.last_publish_at,
        channels=stats.channels, grant=sorted(stats.grant), quiet=stats.quiet,
    )


def agent_status(name: str, stats: SchedulerStats, counts: AgentCounts, standby: Standby | None = None
                 ) -> AgentStatus:
    if standby is not None:  # run by another host: its wakes and turns are that host's to show
        return AgentStatus(
            name=name, state=STANDBY, pending_wakes=0, queued_peer_messages=counts.queued_peer_messages,
            drafts=counts.drafts, outbox_pending=counts.outbox_pending, turns_last_hour=0, held=False,
            last_error=counts.last_error, failed_turns_last_hour=counts.failed_turns_last_hour, owner=standby.owner)
    return AgentStatus(
        name=name, state=stats.state, pending_wakes=stats.pending_wakes,
        queued_peer_messages=counts.queued_peer_messages, drafts=counts.drafts,
        outbox_pending=counts.outbox_pending, turns_last_hour=stats.turns_last_hour, held=stats.held,
        last_error=counts.last_error, failed_turns_last_hour=counts.failed_turns_last_hour,
    )


def build_status(host: HostStatus, connectors: Iterable[ConnectorStatistics], agents: Mapping[str, SchedulerStats],
                 counts: Mapping[str, AgentCounts], hosts: Sequence[HostEntry] = (),
                 standby: Mapping[str, Standby] | None = None,
                 agents_standby: Mapping[str, Standby] | None = None) -> Status:
    """The whole object: connectors and agents in their configured order, then the hosts sharing the store.

    `standby`, `agents_standby`: the connectors and the agents another live host owns, by name."""
    standby = standby or {}
    agents_standby = agents_standby or {}
    return Status(host=host, connectors=[connector_status(c, standby.get(c.name)) for c in connectors],
                  agents=[agent_status(name, stats, counts.get(name, AgentCounts()), agents_standby.get(name))
                          for name, stats in agents.items()],
                  hosts=list(hosts))


def sole_host(name: str, host: HostStatus, connectors: Iterable[str], agents: Iterable[str]) -> HostEntry:
    """The `hosts` entry of a host that shares its store with none (SQLite): itself, owning all it runs."""
    return HostEntry(name=name, pid=host.pid, version=host.version, started_at=host.started_at, heartbeat_age_ms=0,
                     connectors=list(connectors), agents=list(agents))


# --- the --check verdict ---------------------------------------------------------------

#: What stands in for a character a terminal would act on (escapes, bidi controls) in a table or a problem line.
UNPRINTABLE = "\ufffd"
#: Characters of a last error kept in a --check line (`--json` has it whole).
PROBLEM_ERROR_CHARS = 200

#: States a healthy connector may be in: serving, or waiting out an ordinary backoff.
HEALTHY = frozenset({State.READY.value, State.MCP_ONLY.value, State.BACKOFF.value, STANDBY})
#: What each unhealthy state means, for its problem line.
UNHEALTHY_WHY = {
    State.STARTING.value: "starting",
    State.HANDSHAKING.value: "handshaking (initialize not answered yet)",
    State.POLICY_PENDING.value: "policy_pending (its first featureSets/update is unanswered)",
    State.SLOW_LANE.value: "slow_lane (a crash loop: one start every backoff_max_s)",
    State.STOPPED.value: "stopped (no more starts in this run)",
}


def check_problems(status: Status, policies: Mapping[str, str]) -> list[str]:
    """One line per problem, each beginning with its connector's or agent's name and a colon; none: healthy.

    A connector is fine when ready, mcp_only, in backoff or on standby, and not quiet;
    `stopped` is fine only under restart policy `never` (`policies`: name →
    policy), since nothing was meant to start it again. An agent is fine
    unless its newest turn failed (`last_error` set); one on standby is its owner's to report.
    """
    problems = []
    for connector in status.connectors:
        stopped_on_purpose = connector.state == State.STOPPED.value and policies.get(connector.name) == "never"
        if connector.state not in HEALTHY and not stopped_on_purpose:
            why = UNHEALTHY_WHY.get(connector.state, connector.state)
            error = printable(connector.last_error, PROBLEM_ERROR_CHARS) if connector.last_error else None
            problems.append(f"{connector.name}: {why}" + (f"; last error: {error}" if error else ""))
        if connector.quiet:
            problems.append(f"{connector.name}: quiet (ready, no inbound item for longer than expect_traffic_within_s)")
    for agent in status.agents:
        if agent.last_error is not None and agent.state != STANDBY:
            failed = agent.failed_turns_last_hour
            problems.append(f"{agent.name}: its newest turn failed ({printable(agent.last_error, PROBLEM_ERROR_CHARS)});"
                            f" {failed} failed turn{'' if failed == 1 else 's'} in the last hour")
    return problems


# --- the plain table -----------------------------------------------------------------------

#: Cells are cut to this many characters in the table (`--json` has them whole).
CELL_MAX_CHARS = 48


def printable(text: str, limit: int) -> str:
    """`text` on one line, with nothing a terminal acts on, cut to `limit` characters.

    An error text can carry a connector's words: its line breaks would break
    a table or a --check line, its escape sequences would reach the operator's terminal.
    """
    text = "".join(ch if ch.isprintable() else UNPRINTABLE for ch in " ".join(text[: limit * 2].split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cell(value: object) -> str:
    return "-" if value is None else printable(str(value), CELL_MAX_CHARS)


def _state(state: str, owner: str | None) -> str:
    """A state cell; a standby's names its owner ("standby (eu-1)")."""
    return f"{state} ({_cell(owner)})" if state == STANDBY else state


def _ago(epoch_ms: int | None, now_ms: int) -> str:
    """How long ago, at a glance: 12s, 5m, 3h, 2d (None: never)."""
    if epoch_ms is None:
        return "never"
    seconds = max(now_ms - epoch_ms, 0) // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
            for line in [list(header), *rows]]


def render_table(status: Status, *, now_ms: int | None = None) -> list[str]:
    """The status for a person: the host line, a connector table, an agent table."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    host = status.host
    lines = [f"mcplhost {host.version}  pid {host.pid}  up since {_ago(host.started_at, now)}  "
             f"db {host.db} ({host.db_bytes:,} bytes, schema {host.schema_version})", ""]
    lines += _table(
        ["CONNECTOR", "STATE", "PID", "RESTARTS", "INBOUND", "PUBLISH", "CHANNELS", "QUIET", "GRANT", "LAST ERROR"],
        [[_cell(c.name), _state(c.state, c.owner), _cell(c.pid), str(c.restarts), _ago(c.last_inbound_at, now),
          _ago(c.last_publish_at, now), str(c.channels), "quiet" if c.quiet else "-",
          _cell(",".join(c.grant) or None), _cell(c.last_error)] for c in status.connectors],
    ) if status.connectors else ["no connectors configured"]
    lines.append("")
    if len(status.hosts) > 1:  # a store shared by several hosts: who runs what
        lines += _table(["HOST", "PID", "VERSION", "UP SINCE", "HEARTBEAT", "CONNECTORS", "AGENTS"],
                        [[_cell(h.name), str(h.pid), _cell(h.version), _ago(h.started_at, now),
                          f"{h.heartbeat_age_ms / 1000:.1f}s", _cell(",".join(h.connectors) or None),
                          _cell(",".join(h.agents) or None)] for h in status.hosts])
        lines.append("")
    lines += _table(
        ["AGENT", "STATE", "WAKES", "PEER QUEUE", "DRAFTS", "OUTBOX", "TURNS/H", "FAILED/H", "HELD", "LAST ERROR"],
        [[_cell(a.name), _state(a.state, a.owner), str(a.pending_wakes), str(a.queued_peer_messages), str(a.drafts),
          str(a.outbox_pending), str(a.turns_last_hour), str(a.failed_turns_last_hour), "held" if a.held else "-",
          _cell(a.last_error)] for a in status.agents],
    ) if status.agents else ["no agents configured"]
    return lines


# --- systemd's STATUS= ------------------------------------------------------------------------

#: The order states are named in the STATUS= line: serving first, trouble last.
STATE_ORDER = [State.READY, State.MCP_ONLY, State.STARTING, State.HANDSHAKING, State.POLICY_PENDING,
               State.BACKOFF, State.SLOW_LANE, State.STOPPED]


def systemd_status(states: Iterable[State]) -> str:
    """`STATUS=` text with the connectors counted by state, e.g. "3 connectors: 2 ready, 1 backoff"."""
    counted = Counter(states)
    total = sum(counted.values())
    parts = [f"{counted[state]} {state.value}" for state in STATE_ORDER if counted[state]]
    return f"{total} connector{'' if total == 1 else 's'}" + (f": {', '.join(parts)}" if parts else "")
