"""The live handle of one configured connector: one object for the daemon's whole run, across restarts.

`supervise` drives it; everyone else only reads it or calls through it. The
speech router, the agent tools and the status socket hold a handle, never a
connection, because a connection lasts one process life and a handle lasts
as long as the host:

- `state`, `grant`, `channels()` / `channel(id)`, `tools()`: what is in force right now
  (`tools()`: the MCP tools listed after each ready handshake and on
  `notifications/tools/list_changed`, while `tools` is granted);
- `request()` / `notify()`: host-initiated calls while the connector serves
  (ready, or mcp_only for plain MCP calls such as `tools/call`), else a
  typed `ConnectorNotReady`; a call caught by the end of a life gets
  `ConnectorGone`, never a hang;
- `wait_ready()` / `wait_state()` / `wait_channel()`: awaitable conditions, so senders and catch-up never poll;
- `statistics()`: the frozen snapshot the status socket reports;
- `quiet()` / `wait_activity()`: the quiet rule on this handle's times
  (liveness.py), and what the life's quiet watcher (watch.py) waits on.
- `restart()`: `mcplhost restart-connector` (docs/operations.md#status-and-the-control-socket): the
  supervisor ends the current life (or the wait before the next) at once and starts again with a
  fresh restart budget.

The connector states are the ones the status socket shows (docs/operations.md). Which may follow which is data
(`TRANSITIONS`); each change is logged once, as the state's canonical line
(`STATE_EVENTS`). The live states (handshaking, policy_pending, ready,
mcp_only) follow the connection's own `Mode`, which `McplConnection(on_mode=...)`
reports the moment the protocol layer assigns it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

import anyio
import msgspec
import structlog
from msgspec import UNSET

from mcplhost.config import ConnectorConfig
from mcplhost.logs import SuppressedTotals
from mcplhost.protocol.answers import ListedTool, OpenedChannel
from mcplhost.protocol.channels import Channel
from mcplhost.protocol.connection import McplConnection, Mode
from mcplhost.protocol.counts import RefusalCounts
from mcplhost.protocol.intake import AdmittedMessage, AdmittedPush, Intake
from mcplhost.protocol.ports import (
    SERVING,
    ConnectorGone,
    ConnectorNotReady,
    ConnectorStopped,
    InferenceService,
    PendingHooks,
    State,
)
from mcplhost.rpc import ConnectionClosed, RemoteError, Session

from .liveness import is_quiet, quiet_at

log = structlog.get_logger()


#: The states of a running process life, which hold only while its connection does.
LIVE = frozenset({State.HANDSHAKING, State.POLICY_PENDING, State.READY, State.MCP_ONLY})
#: States in which no channel is coming soon: stopped for good, a crash loop's slow lane, plain MCP.
GAVE_UP = frozenset({State.STOPPED, State.SLOW_LANE, State.MCP_ONLY})
#: Where a life can end: whatever it was doing, the supervisor then waits, or stops for good.
_LIFE_ENDS = frozenset({State.BACKOFF, State.SLOW_LANE, State.STOPPED})

#: Which state may follow which. Anything else is a bug of ours, logged as one.
TRANSITIONS: Mapping[State, frozenset[State]] = MappingProxyType({
    State.STARTING: frozenset({State.HANDSHAKING}) | _LIFE_ENDS,  # or the spawn failed
    State.HANDSHAKING: frozenset({State.POLICY_PENDING, State.MCP_ONLY}) | _LIFE_ENDS,  # no manifest: MCP only
    State.POLICY_PENDING: frozenset({State.READY, State.MCP_ONLY}) | _LIFE_ENDS,  # fallback "mcp-only"
    State.READY: frozenset({State.MCP_ONLY}) | _LIFE_ENDS,  # a later policy refused with fallback "mcp-only"
    State.MCP_ONLY: _LIFE_ENDS,
    State.BACKOFF: frozenset({State.STARTING, State.STOPPED}),
    State.SLOW_LANE: frozenset({State.STARTING, State.STOPPED}),
    State.STOPPED: frozenset(),
})

#: The one log line per state change: its event name and level. Older names kept, since operators grep for them.
STATE_EVENTS: Mapping[State, tuple[str, str]] = MappingProxyType({
    State.STARTING: ("connector.starting", "info"),
    State.HANDSHAKING: ("connector.spawned", "info"),
    State.POLICY_PENDING: ("connector.policy_pending", "info"),
    State.READY: ("connector.up", "info"),
    State.MCP_ONLY: ("connector.up", "info"),
    State.BACKOFF: ("connector.restart_scheduled", "info"),
    State.SLOW_LANE: ("connector.slow_lane", "warning"),
    State.STOPPED: ("connector.stopped", "warning"),
})

#: The connection's modes as connector states. `Mode.CLOSED` is missing on purpose: the
#: life is ending, and the supervisor decides what follows (backoff or stopped).
MODE_STATES: Mapping[Mode, State] = MappingProxyType({
    Mode.HANDSHAKE: State.HANDSHAKING,
    Mode.POLICY_PENDING: State.POLICY_PENDING,
    Mode.READY: State.READY,
    Mode.MCP_ONLY: State.MCP_ONLY,
})


def allowed(current: State, new: State) -> bool:
    """Whether `new` may follow `current` (staying put is always allowed: it is no change)."""
    return new is current or new in TRANSITIONS[current]


class ConnectorStatistics(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One connector as the status socket reports it (docs/operations.md).

    Encoded, it has the status JSON's names (lastError, lastInboundAt); encode
    with order="deterministic" for a sorted grant.
    """

    name: str
    state: State
    pid: int | None  # None while no process runs
    restarts: int  # restarts performed since the host started
    last_error: str | None
    last_inbound_at: int | None  # epoch ms of the last admitted channels/incoming message or push/event
    channels: int  # registered channels now
    grant: frozenset[str]  # in force now
    last_publish_at: int | None = None  # epoch ms of the last delivered channels/publish
    quiet: bool = False  # ready and silent past expect_traffic_within_s (docs/operations.md#quiet-and-deaf-connectors)


def now_ms() -> int:
    return int(time.time() * 1000)


class ConnectorHandle:
    """One configured connector for the host's whole run. Read by anyone; written by `supervise` only."""

    def __init__(self, spec: ConnectorConfig, *, clock_ms: Callable[[], int] = now_ms,
                 monotonic: Callable[[], float] = time.monotonic,
                 offered: frozenset[str] | None = None, inference: InferenceService | None = None,
                 hooks: PendingHooks | None = None, on_change: Callable[[], None] = lambda: None,
                 suppressed: SuppressedTotals | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        #: What each life's connection may grant (None: the connection's default, no inference paths).
        self.offered = offered
        #: The `[inference]` service each life's connection serves inference/request with (None: not configured).
        self.inference = inference
        #: The loop guard's question each life's connection asks (None: no hook is ever pending).
        self.hooks = hooks
        #: What every life refused, for the host's whole run (each life's connection adds to it).
        self.refusals = RefusalCounts()
        #: The host's count of suppressed log lines; each life's LimitedLog adds this connector's to it.
        self.suppressed = suppressed if suppressed is not None else SuppressedTotals()
        self._clock_ms = clock_ms  # epoch ms, for what status shows
        #: Monotonic seconds, for the quiet rule: a wall-clock step neither starts nor ends a quiet spell.
        self.monotonic = monotonic
        self._log = log.bind(connector=spec.name)
        self._state = State.STARTING
        self._changed = anyio.Event()  # set, and replaced, at every state change
        self._connection: McplConnection | None = None  # while a life serves or is about to
        self._pid: int | None = None
        self._lives = 0
        self._last_error: str | None = None
        self._last_inbound_at: int | None = None
        self._serving_since: float | None = None  # monotonic: when this life began serving (None: it does not)
        self._last_inbound_mono: float | None = None  # monotonic twin of _last_inbound_at
        self._activity: anyio.Event | None = None  # while the quiet watcher waits: set by an inbound item or a change
        self._last_publish_at: int | None = None
        self._on_change = on_change  # called after every state change (the host's STATUS= line)
        self._restart_scope: anyio.CancelScope | None = None  # the life or wait `restart()` cuts short
        self._restart_requested = False

    # --- read-only views ---------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def grant(self) -> frozenset[str]:
        """The grant in force now; empty while no MCPL connection serves."""
        return self._connection.grant if self._connection is not None else frozenset()

    def channels(self) -> list[Channel]:
        """The channels registered now (frozen descriptors); none while no connection serves."""
        return self._connection.registry.channels() if self._connection is not None else []

    def channel(self, channel_id: str) -> Channel | None:
        return self._connection.registry.get(channel_id) if self._connection is not None else None

    def tools(self) -> list[ListedTool]:
        """The connector's MCP tools (as `tools/list` gave them) while it serves and holds `tools`; else none."""
        connection = self._connection
        if connection is None or self._state not in SERVING or "tools" not in connection.grant:
            return []
        return list(connection.tools or [])

    def statistics(self) -> ConnectorStatistics:
        return ConnectorStatistics(
            name=self.name, state=self._state, pid=self._pid, restarts=max(self._lives - 1, 0),
            last_error=self._last_error, last_inbound_at=self._last_inbound_at,
            channels=len(self.channels()), grant=self.grant, last_publish_at=self._last_publish_at,
            quiet=self.quiet(),
        )

    def quiet(self, now: float | None = None) -> bool:
        """Whether the connector is quiet at monotonic `now` (default: this moment), by liveness.is_quiet."""
        return is_quiet(self._state, self._serving_since, self._last_inbound_mono,
                        self.monotonic() if now is None else now, self.spec.expect_traffic_within_s)

    def quiet_deadline(self) -> float | None:
        """The monotonic time after which the connector is quiet if nothing arrives; None: it cannot become quiet."""
        if self._state not in SERVING:
            return None
        return quiet_at(self._serving_since, self._last_inbound_mono, self.spec.expect_traffic_within_s)

    async def wait_activity(self) -> None:
        """Wait for the next inbound item or state change (the quiet watcher, while a spell lasts)."""
        if self._activity is None:
            self._activity = anyio.Event()
        await self._activity.wait()

    def published(self) -> None:
        """A channels/publish was delivered now (the outbox sender's word), for `statistics().last_publish_at`."""
        self._last_publish_at = self._clock_ms()

    def carry_over(self, previous: ConnectorHandle) -> None:
        """Continue `previous`'s counts, as one handle does across `restart()`: a reload that changed this
        connector's table replaces its handle, yet what it counted since the host started is kept (restarts,
        refusals, the last error, inbound and publish times). Called before this handle's first life."""
        self._lives = previous._lives  # this handle's first start counts as one more restart
        self.refusals = previous.refusals
        self._last_error = previous._last_error
        self._last_inbound_at, self._last_inbound_mono = previous._last_inbound_at, previous._last_inbound_mono
        self._last_publish_at = previous._last_publish_at

    def restart(self) -> None:
        """End the current life, or the wait before the next, now; start again at once with a fresh budget.

        Raises ConnectorStopped when the connector stopped for good (policy
        never, a refused policy, or the host is stopping): nothing would start it.
        """
        if self._state is State.STOPPED:
            raise ConnectorStopped(self.name, self._state, "it stopped for good in this run of the host"
                                   + (f" ({self._last_error})" if self._last_error else ""))
        self._restart_requested = True
        if self._restart_scope is not None:
            self._restart_scope.cancel()

    # --- calls to the connector ----------------------------------------------------

    async def request(self, method: str, params: Any = UNSET, *, timeout: float | None = None,
                      result_type: Any = Any) -> Any:
        """Send a request while the connector serves; return its result decoded as `result_type`.

        Raises ConnectorNotReady when it does not serve, ConnectorGone when its
        life ends before the answer, the session's RemoteError or
        RequestTimeout as they come (`timeout` None: the connector's
        request_timeout_s), and msgspec.ValidationError for a result that is
        not a `result_type`. Whether the grant permits the call is the
        caller's rule (the speech router checks channels.publish), not this
        conduit's.
        """
        session = self._serving_session(method)
        try:
            raw = await session.request(method, params, timeout=timeout)
        except ConnectionClosed as exc:
            raise ConnectorGone(self.name, self._state, f"its process life ended before {method} was answered ({exc})"
                                ) from exc
        return msgspec.json.decode(bytes(raw), type=result_type)

    async def request_with_grant(self, method: str, params: Any = UNSET, *, timeout: float | None = None,
                                 result_type: Any = Any) -> tuple[Any, frozenset[str]]:
        """`request` (its result decoded as `result_type`), and the grant in force the moment the answer arrived.

        For answers whose parts are authorized at receipt (each
        `beforeInference` injection, docs/mcpl-checklist.md item 9): a policy change the
        connector's next message brings cannot slip in between.
        """
        session = self._serving_session(method)
        connection = self._connection

        def at_receipt(outcome: Any) -> tuple[Any, frozenset[str]]:
            return outcome, (connection.grant if connection is not None else frozenset())

        try:
            outcome, grant = await session.request(method, params, timeout=timeout, at_receipt=at_receipt)
        except ConnectionClosed as exc:
            raise ConnectorGone(self.name, self._state, f"its process life ended before {method} was answered ({exc})"
                                ) from exc
        if isinstance(outcome, RemoteError):
            raise outcome
        return msgspec.json.decode(bytes(outcome), type=result_type), grant

    async def notify(self, method: str, params: Any = UNSET) -> None:
        """Send a notification while the connector serves; the same refusals as `request`."""
        session = self._serving_session(method)
        try:
            await session.notify(method, params)
        except ConnectionClosed as exc:
            raise ConnectorGone(self.name, self._state, f"its process life ended before {method} went out ({exc})"
                                ) from exc

    async def open_channel(self, channel_id: str, *, timeout: float | None = None,
                           history: int = 0) -> OpenedChannel:
        """channels/open for a registered channel; its result (with any backscroll the connector sends).

        The same refusals as `request`, plus the protocol's -32002 error when
        `channels.lifecycle` is not granted and KeyError for a channel not registered now.
        """
        self._serving_session("channels/open")
        connection = self._connection
        channel = connection.registry.get(channel_id) if connection is not None else None
        if connection is None or channel is None:
            raise KeyError(channel_id)
        try:
            return await connection.open_channel(channel, timeout=timeout, history=history)
        except ConnectionClosed as exc:
            raise ConnectorGone(self.name, self._state, f"its process life ended before channels/open was answered"
                                f" ({exc})") from exc

    def _serving_session(self, method: str) -> Session:
        connection = self._connection
        if self._state not in SERVING:
            raise ConnectorNotReady(self.name, self._state, f"{method} not sent: the connector is {self._state.value}")
        if connection is None:
            raise ConnectorNotReady(self.name, self._state, f"{method} not sent: its process life is ending")
        return connection.session

    async def wait_state(self, *states: State) -> State:
        """Wait until the connector is in one of `states`; return the one it is in.

        A live state (handshaking to mcp_only) counts only while its life's
        connection lasts: once the connector's output has ended, "ready" is
        not awaited any more, so a sender never spins on a dying life.
        Raises ConnectorStopped once it has stopped for good (unless `stopped`
        is one of the states awaited). A state that came and went before this
        task ran is missed: wait for states that last.
        """
        while self._state not in states or (self._state in LIVE and self._connection is None):
            if self._state is State.STOPPED:
                raise ConnectorStopped(self.name, self._state, "stopped for good in this run of the host")
            await self._changed.wait()
        return self._state

    async def wait_ready(self) -> None:
        """Wait until MCPL is in force (ready); ConnectorStopped if that cannot happen any more."""
        await self.wait_state(State.READY)

    async def wait_channel(self, channel_id: str) -> bool:
        """Wait until `channel_id` is registered (True), or the connector gave up on it (False): stopped for good,
        in the slow lane of a crash loop, or serving plain MCP, which registers no channel."""
        while self.channel(channel_id) is None:
            if self._state in GAVE_UP:
                return False
            await self._changed.wait()
        return True

    def channels_changed(self) -> None:
        """The life's registered channels changed (the connection says so): waiters look again."""
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    # --- driven by supervise ---------------------------------------------------------

    @contextmanager
    def restartable(self) -> Iterator[None]:
        """The supervisor's current life or wait, which `restart()` cuts short (a restart asked just before
        cuts it at once)."""
        with anyio.CancelScope() as scope:
            self._restart_scope = scope
            if self._restart_requested:
                scope.cancel()
            try:
                yield
            finally:
                self._restart_scope = None

    def take_restart(self) -> bool:
        """Whether `restart()` was asked since the last call; if so, the next start is logged as asked for."""
        if not self._restart_requested:
            return False
        self._restart_requested = False
        if self._state is State.STOPPED:  # the life gave up on its own just before: nothing starts it again
            return False
        self._log.info("connector.restart_requested", state=self._state.value, detail="restart-connector: "
                       "starting again now, with a fresh restart budget")
        if self._state not in (State.BACKOFF, State.SLOW_LANE):  # a life cut short: it waits no delay
            self._connection = None
            self._enter(State.BACKOFF, delay_s=0)
        return True

    def inbound_clock(self, intake: Intake) -> Intake:
        """`intake`, stamping `last_inbound_at` with every admitted message or push handed to it."""
        return _StampingIntake(intake, self._stamp_inbound)

    def starting(self) -> None:
        """A new process life begins (the first, or a restart)."""
        self._lives += 1
        self._enter(State.STARTING, restarts=max(self._lives - 1, 0))

    def spawned(self, pid: int, connection: McplConnection, **fields: Any) -> None:
        """The process runs and `connection` (built with `on_mode=handle.mode_entered`) speaks to it."""
        self._pid, self._connection = pid, connection
        self._enter(State.HANDSHAKING, pid=pid, **fields)

    def mode_entered(self, connection: McplConnection, mode: Mode) -> None:
        """The connection moved to `mode`: follow it while it is this life's connection."""
        if connection is not self._connection:
            return  # still being built, or a past life's
        if mode is Mode.CLOSED:
            self.life_ending()  # nothing more goes through; the supervisor ends the life
            return
        state = MODE_STATES[mode]
        self._enter(state, pid=self._pid, **({"mode": state.value} if state in SERVING else {}))

    def life_ending(self) -> None:
        """The life is over (its output ended, or it is being stopped): refuse calls from now on.

        The state keeps its label until the supervisor's decision a moment
        later, but waiters for a live state wake up and wait on.
        """
        if self._connection is not None:
            self._connection = None
            self._wake()

    def exited(self) -> None:
        """The process is gone."""
        self._pid = None

    def failed(self, error: str) -> None:
        """Why the latest life ended (or never began), for `statistics().last_error`."""
        self._last_error = error

    def waiting(self, state: State, **fields: Any) -> None:
        """The life ended: wait in `state` (backoff or slow_lane) until the next start."""
        self._connection = None
        self._enter(state, **({"error": self._last_error} if self._last_error else {}), **fields)

    def stopped(self, reason: str, *, expected: bool = False, **fields: Any) -> None:
        """No more starts: given up, or (`expected`) the host is stopping. Repeats are ignored."""
        if self._state is not State.STOPPED:
            self._connection = None
            self._enter(State.STOPPED, level="info" if expected else None, reason=reason, **fields)

    def _enter(self, state: State, *, level: str | None = None, **fields: Any) -> None:
        previous = self._state
        if state is previous:
            return
        if not allowed(previous, state):
            self._log.error("connector.state_unexpected", state=state.value, previous=previous.value)
        self._state = state
        if state not in SERVING:
            self._serving_since = None
        elif previous not in SERVING:
            self._serving_since = self.monotonic()
        event, default_level = STATE_EVENTS[state]
        getattr(self._log, level or default_level)(event, state=state.value, previous=previous.value, **fields)
        self._wake()
        self._on_change()

    def _wake(self) -> None:
        """Let every waiter look again."""
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        self._tell_activity()

    def _tell_activity(self) -> None:
        activity, self._activity = self._activity, None
        if activity is not None:
            activity.set()

    def _stamp_inbound(self) -> None:
        self._last_inbound_at = self._clock_ms()
        self._last_inbound_mono = self.monotonic()
        self._tell_activity()


class _StampingIntake:
    """An Intake that notes the time of each admitted item before passing it on."""

    def __init__(self, intake: Intake, stamp: Callable[[], None]) -> None:
        self._intake = intake
        self._stamp = stamp

    async def store_messages(self, server_id: str, lane: str, messages: list[AdmittedMessage]) -> Any:
        if messages:
            self._stamp()
        return await self._intake.store_messages(server_id, lane, messages)

    async def store_push(self, server_id: str, push: AdmittedPush) -> Any:
        self._stamp()
        return await self._intake.store_push(server_id, push)

    def content_problem(self, blocks: list[dict[str, Any]]) -> str | None:
        return self._intake.content_problem(blocks)
