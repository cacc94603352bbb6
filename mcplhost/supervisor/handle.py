"""The live handle of one configured connector: one object for the daemon's whole run, across restarts.

It is the read-only view that implements the connector ports
(mcplhost/protocol/ports.py): the speech router, the outbox sender, the
agents and the status socket hold a handle, never a connection, because a
connection lasts one process life and a handle lasts as long as the host.
It owns no state of its own but the per-run counts; it reads:

- `life` (lifecycle.py), what `supervise` writes: the state, the current
  life's process and connection, lives and the last error;
- `traffic` (traffic.py), the last inbound and publish times, which the
  life's intake wrapper (`StampingIntake`) and the outbox sender stamp.

What it offers:

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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET

from mcplhost.config import ConnectorConfig
from mcplhost.logs import SuppressedTotals
from mcplhost.protocol.answers import ListedTool, OpenedChannel
from mcplhost.protocol.channels import Channel
from mcplhost.protocol.counts import RefusalCounts
from mcplhost.protocol.ports import (
    SERVING,
    AcknowledgePort,
    CatchUpPort,
    ChannelListing,
    ConnectorGone,
    ConnectorNotReady,
    ConnectorStopped,
    HookPort,
    InferenceService,
    NotifyPort,
    OutboxPort,
    PendingHooks,
    State,
    ToolPort,
)
from mcplhost.rpc import ConnectionClosed, RemoteError, Session

from .lifecycle import GAVE_UP, LIVE, Lifecycle
from .liveness import is_quiet, quiet_at
from .traffic import Traffic

__all__ = ["ConnectorGone", "ConnectorHandle", "ConnectorNotReady", "ConnectorStatistics", "ConnectorStopped",
           "SERVING", "State", "now_ms"]


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
    """One configured connector for the host's whole run: the ports' implementation, read by anyone.

    `supervise` writes `life`; what each life's connection is built with
    (`offered`, `inference`, `hooks`, the run's `refusals` and `suppressed`
    totals) is set here, by the host, once.
    """

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
        #: Monotonic seconds, for the quiet rule: a wall-clock step neither starts nor ends a quiet spell.
        self.monotonic = monotonic
        #: The inbound and publish times (the life's intake wrapper and the outbox sender stamp them).
        self.traffic = Traffic(clock_ms=clock_ms, monotonic=monotonic)
        #: The state and the current life, written by `supervise` only; `on_change` is the host's STATUS= line.
        self.life = Lifecycle(spec.name, monotonic=monotonic, on_change=on_change, on_wake=self.traffic.stir)

    # --- read-only views ---------------------------------------------------------

    @property
    def state(self) -> State:
        return self.life.state

    @property
    def grant(self) -> frozenset[str]:
        """The grant in force now; empty while no MCPL connection serves."""
        connection = self.life.connection
        return connection.grant if connection is not None else frozenset()

    def channels(self) -> list[Channel]:
        """The channels registered now (frozen descriptors); none while no connection serves."""
        connection = self.life.connection
        return connection.registry.channels() if connection is not None else []

    def channel(self, channel_id: str) -> Channel | None:
        connection = self.life.connection
        return connection.registry.get(channel_id) if connection is not None else None

    def tools(self) -> list[ListedTool]:
        """The connector's MCP tools (as `tools/list` gave them) while it serves and holds `tools`; else none."""
        connection = self.life.connection
        if connection is None or self.life.state not in SERVING or "tools" not in connection.grant:
            return []
        return list(connection.tools or [])

    @property
    def lives(self) -> int:
        """Process lives started since the host started: a new number is a new life (the outbox sender's grace)."""
        return self.life.lives

    def statistics(self) -> ConnectorStatistics:
        life, traffic = self.life, self.traffic
        return ConnectorStatistics(
            name=self.name, state=life.state, pid=life.pid, restarts=max(life.lives - 1, 0),
            last_error=life.last_error, last_inbound_at=traffic.last_inbound_at,
            channels=len(self.channels()), grant=self.grant, last_publish_at=traffic.last_publish_at,
            quiet=self.quiet(),
        )

    def quiet(self, now: float | None = None) -> bool:
        """Whether the connector is quiet at monotonic `now` (default: this moment), by liveness.is_quiet."""
        return is_quiet(self.life.state, self.life.serving_since, self.traffic.last_inbound_mono,
                        self.monotonic() if now is None else now, self.spec.expect_traffic_within_s)

    def quiet_deadline(self) -> float | None:
        """The monotonic time after which the connector is quiet if nothing arrives; None: it cannot become quiet."""
        if self.life.state not in SERVING:
            return None
        return quiet_at(self.life.serving_since, self.traffic.last_inbound_mono, self.spec.expect_traffic_within_s)

    async def wait_activity(self) -> None:
        """Wait for the next inbound item or state change (the quiet watcher, while a spell lasts)."""
        await self.traffic.wait_activity()

    def published(self) -> None:
        """A channels/publish was delivered now (the outbox sender's word), for `statistics().last_publish_at`."""
        self.traffic.published()

    def carry_over(self, previous: ConnectorHandle) -> None:
        """Continue `previous`'s counts, as one handle does across `restart()`: a reload that changed this
        connector's table replaces its handle, yet what it counted since the host started is kept (restarts,
        refusals, the last error, inbound and publish times). Called before this handle's first life."""
        self.life.carry_over(previous.life)
        self.refusals = previous.refusals
        self.traffic.carry_over(previous.traffic)

    def restart(self) -> None:
        """End the current life, or the wait before the next, now; start again at once with a fresh budget.

        Raises ConnectorStopped when the connector stopped for good (policy
        never, a refused policy, or the host is stopping): nothing would start it.
        """
        self.life.request_restart()

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
            raise ConnectorGone(self.name, self.life.state, f"its process life ended before {method} was answered ({exc})"
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
        connection = self.life.connection

        def at_receipt(outcome: Any) -> tuple[Any, frozenset[str]]:
            return outcome, (connection.grant if connection is not None else frozenset())

        try:
            outcome, grant = await session.request(method, params, timeout=timeout, at_receipt=at_receipt)
        except ConnectionClosed as exc:
            raise ConnectorGone(self.name, self.life.state, f"its process life ended before {method} was answered ({exc})"
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
            raise ConnectorGone(self.name, self.life.state, f"its process life ended before {method} went out ({exc})"
                                ) from exc

    async def open_channel(self, channel_id: str, *, timeout: float | None = None,
                           history: int = 0) -> OpenedChannel:
        """channels/open for a registered channel; its result (with any backscroll the connector sends).

        The same refusals as `request`, plus the protocol's -32002 error when
        `channels.lifecycle` is not granted and KeyError for a channel not registered now.
        """
        self._serving_session("channels/open")
        connection = self.life.connection
        channel = connection.registry.get(channel_id) if connection is not None else None
        if connection is None or channel is None:
            raise KeyError(channel_id)
        try:
            return await connection.open_channel(channel, timeout=timeout, history=history)
        except ConnectionClosed as exc:
            raise ConnectorGone(self.name, self.life.state, f"its process life ended before channels/open was answered"
                                f" ({exc})") from exc

    def _serving_session(self, method: str) -> Session:
        connection = self.life.connection
        if self.life.state not in SERVING:
            raise ConnectorNotReady(self.name, self.life.state, f"{method} not sent: the connector is {self.life.state.value}")
        if connection is None:
            raise ConnectorNotReady(self.name, self.life.state, f"{method} not sent: its process life is ending")
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
        while self.life.state not in states or (self.life.state in LIVE and self.life.connection is None):
            if self.life.state is State.STOPPED:
                raise ConnectorStopped(self.name, self.life.state, "stopped for good in this run of the host")
            await self.life.wait_change()
        return self.life.state

    async def wait_ready(self) -> None:
        """Wait until MCPL is in force (ready); ConnectorStopped if that cannot happen any more."""
        await self.wait_state(State.READY)

    async def wait_channel(self, channel_id: str) -> bool:
        """Wait until `channel_id` is registered (True), or the connector gave up on it (False): stopped for good,
        in the slow lane of a crash loop, or serving plain MCP, which registers no channel."""
        while self.channel(channel_id) is None:
            if self.life.state in GAVE_UP:
                return False
            await self.life.wait_change()
        return True


if TYPE_CHECKING:  # the type checker holds the handle to every port the host hands it in as

    def _implements_the_ports(handle: ConnectorHandle) -> None:
        _outbox: OutboxPort = handle
        _notify: NotifyPort = handle
        _acknowledge: AcknowledgePort = handle
        _hooks: HookPort = handle
        _catch_up: CatchUpPort = handle
        _listing: ChannelListing = handle
        _tools: ToolPort = handle
