"""Hosts sharing one PostgreSQL store: the hosts table, heartbeats, and who owns which connector and which agent
(docs/operations.md#several-hosts-on-one-store).

    async with store.session() as session:           # a connection of its own, outside the pool
        sharing = Sharing(session, HostIdentity(name="eu-1", pid=..., version=..., started_at=...))
        await tg.start(sharing.run)                  # registers, then heartbeats every HEARTBEAT_S
        if not await sharing.try_own("discord"):     # another live host runs it: this one stands by
            await sharing.own("discord")             # returns once the lock came free and is held
        ...
        await sharing.release("discord")
        await sharing.try_own("scout", kind="agent")   # agents alike, in a key space of their own
        await sharing.listen(ITEMS_CHANNEL, nudge)     # NOTIFYs on the session (agents/follow.py)

Ownership is a session-level advisory lock (`pg_try_advisory_lock`, key
`order.ownership_key`) held on the session connection: the server drops it when
that session ends, so a host that dies (kill -9, a lost machine) frees what it
owned as soon as the server notices, and a standby's next try takes it. Two hosts
never hold one lock, so they never run one connector (or agent) at once. A host whose
session breaks has lost its locks: `run` raises (the host stops) rather than run
on without them.

The hosts table says who is live and what each owns: a host upserts its row at
start and at each heartbeat (the database's clock, so machines' clocks never
disagree), and deletes it at a clean stop; a row whose heartbeat is older than
LIVE_BOUND_MS is not live, nor one whose session the server has ended (its
`session_pid` is no longer in pg_stat_activity: a host killed leaves the list
when its locks come free, not a bound later). PostgreSQL only: an SQLite store has one daemon.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import anyio
import msgspec
import structlog
from anyio.abc import TaskStatus

from mcplhost.store.connection import Session
from mcplhost.store.errors import StoreError
from mcplhost.store.order import ownership_key

log = structlog.get_logger()

#: Seconds between a host's heartbeats.
HEARTBEAT_S = 2.0
#: A host whose newest heartbeat is older than this is not live (several missed beats).
LIVE_BOUND_MS = 15_000
#: Seconds between a standby's tries of a lock another host holds.
RETRY_S = 1.0
#: Seconds a clean stop may spend deleting its row (the session may be gone).
GOODBYE_TIMEOUT_S = 5.0

_NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
_names = msgspec.json.Decoder(list[str])


class HostIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """What a host says of itself in the hosts table."""

    name: str
    pid: int
    version: str
    started_at: int  # epoch ms


class LiveHost(msgspec.Struct, frozen=True, kw_only=True):
    """One live host's row, read back."""

    name: str
    pid: int
    version: str
    started_at: int
    heartbeat_age_ms: int
    connectors: list[str]
    agents: list[str]


#: What a host owns by advisory lock (store/order.py `ownership_key`): one key space per kind.
Kind = Literal["connector", "agent"]


class Sharing:
    """This host's part in a shared store: its row, its heartbeats, and the connectors and agents it owns or stands
    by for."""

    def __init__(self, session: Session, identity: HostIdentity) -> None:
        self.identity = identity
        self._session = session
        self._lock = anyio.Lock()  # one statement at a time on the session connection
        #: Per kind, the names owned, in the order taken, and those stood by for.
        self._owned: dict[Kind, dict[str, None]] = {"connector": {}, "agent": {}}
        self._standby: dict[Kind, dict[str, None]] = {"connector": {}, "agent": {}}
        self._changed = anyio.Event()

    @property
    def owned(self) -> list[str]:
        """The connectors this host owns."""
        return list(self._owned["connector"])

    @property
    def agents(self) -> list[str]:
        """The agents this host owns."""
        return list(self._owned["agent"])

    def is_standby(self, name: str, *, kind: Kind = "connector") -> bool:
        return name in self._standby[kind]

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Register, then heartbeat until cancelled; delete the row on the way out.

        A session the server ends is noticed at once (not at the next beat): the beat then fails and `run`
        raises, so the host stops about when a standby may take its locks, not a heartbeat later."""
        self._session.on_lost(lambda: self._changed.set())
        await self._beat()
        task_status.started()
        try:
            while True:
                with anyio.move_on_after(HEARTBEAT_S):
                    await self._changed.wait()  # a take-over is published at once, not at the next beat
                self._changed = anyio.Event()
                await self._beat()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(GOODBYE_TIMEOUT_S):
                try:
                    await self._execute("DELETE FROM hosts WHERE name = ? AND pid = ?",
                                        (self.identity.name, self.identity.pid))
                except Exception as exc:  # the session is gone: its row ages out instead
                    log.warning("hosts.goodbye_failed", error=str(exc))

    async def try_own(self, name: str, *, kind: Kind = "connector") -> bool:
        """Take `name`'s lock if it is free (or held already); False: another live session holds it."""
        if name in self._owned[kind]:
            return True
        ((taken,),) = await self._fetch("SELECT pg_try_advisory_lock(?)", (ownership_key(kind, name),))
        if taken:
            self._standby[kind].pop(name, None)
            self._owned[kind][name] = None
            self._changed.set()
            log.info(f"hosts.{kind}_owned", **{kind: name}, host=self.identity.name)
        return bool(taken)

    async def own(self, name: str, *, kind: Kind = "connector") -> None:
        """Stand by for `name` until its lock is taken (tried every RETRY_S)."""
        self._standby[kind][name] = None
        try:
            while not await self.try_own(name, kind=kind):
                await anyio.sleep(RETRY_S)
        finally:
            self._standby[kind].pop(name, None)

    async def release(self, name: str, *, kind: Kind = "connector") -> None:
        """Give `name`'s lock back (it stopped or was removed here); nothing if it was not held."""
        if name in self._owned[kind]:
            del self._owned[kind][name]
            self._changed.set()
            try:
                await self._execute("SELECT pg_advisory_unlock(?)", (ownership_key(kind, name),))
            except Exception as exc:  # the session is gone, and its locks with it: `run` stops the host
                log.warning("hosts.release_failed", **{kind: name}, error=str(exc))

    async def listen(self, channel: str, heard: Callable[[str], None]) -> None:
        """Call `heard(payload)` for each NOTIFY on `channel` while the session lasts (store/order.py ITEMS_CHANNEL).

        On the session connection: a host whose session breaks stops (`run`), so a listener never dies unnoticed.
        """
        async with self._lock:
            await self._session.listen(channel, heard)

    async def live_hosts(self) -> list[LiveHost]:
        """Every host whose heartbeat is within LIVE_BOUND_MS and whose session is open, by name."""
        rows = await self._fetch(
            f"SELECT name, pid, version, started_at, {_NOW_MS} - heartbeat_at, connectors, agents FROM hosts"
            f" WHERE heartbeat_at > {_NOW_MS} - ?"
            f" AND EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = hosts.session_pid) ORDER BY name",
            (LIVE_BOUND_MS,))
        return [LiveHost(name=name, pid=pid, version=version, started_at=started, heartbeat_age_ms=max(age, 0),
                         connectors=_names.decode(connectors), agents=_names.decode(agents))
                for name, pid, version, started, age, connectors, agents in rows]

    async def owner_of(self, name: str, *, kind: Kind = "connector") -> str | None:
        """The live host (other than this one) that lists `name` as its own, if any."""
        return owner_in(await self.live_hosts(), name, kind=kind, besides=self.identity.name)

    async def holds(self, connector: str) -> bool:
        """Whether this host holds `connector`'s lock now: taken here, and its session still open (one round trip).

        The outbox sender asks before each publish (speech/outbox.py), so a host whose session the
        server ended (its locks gone, perhaps to a standby) sends nothing more before it stops.
        """
        if connector not in self.owned:
            return False
        try:
            await self._fetch("SELECT 1", ())
        except StoreError:  # the session is gone, its locks with it: `run` stops the host
            return False
        return True

    async def _beat(self) -> None:
        me = self.identity
        await self._execute(
            f"INSERT INTO hosts (name, pid, version, started_at, heartbeat_at, connectors, agents, session_pid)"
            f" VALUES (?, ?, ?, ?, {_NOW_MS}, ?, ?, pg_backend_pid()) ON CONFLICT (name) DO UPDATE SET"
            f" pid = excluded.pid, version = excluded.version, started_at = excluded.started_at,"
            f" heartbeat_at = excluded.heartbeat_at, connectors = excluded.connectors, agents = excluded.agents,"
            f" session_pid = excluded.session_pid",
            (me.name, me.pid, me.version, me.started_at, msgspec.json.encode(self.owned).decode(),
             msgspec.json.encode(self.agents).decode()))

    async def _execute(self, sql: str, params: tuple[object, ...]) -> None:
        await self._fetch(sql, params)

    async def _fetch(self, sql: str, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
        """One statement on the session; a broken session (its locks are gone with it) is a StoreError."""
        async with self._lock:
            try:
                return await self._session.fetch(sql, params)
            except Exception as exc:  # the driver's errors are store/postgres.py's to name; all mean the same here
                raise StoreError(f"host {self.identity.name}: the store session holding its connector locks failed:"
                                 f" {' '.join(str(exc).split()) or type(exc).__name__}",
                                 explanation="the host stops rather than run connectors it may no longer own;"
                                             " start it again") from exc


def owner_in(hosts: list[LiveHost], name: str, *, kind: Kind, besides: str) -> str | None:
    """The host among `hosts`, other than `besides`, that lists `name` (a connector or an agent) as its own."""
    return next((host.name for host in hosts if host.name != besides
                 and name in (host.connectors if kind == "connector" else host.agents)), None)
