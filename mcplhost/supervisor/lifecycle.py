"""What the supervisor writes about one connector: its state, and the process and connection of the current life.

`supervise` (supervise.py) is the only writer, through the methods below;
the connector's handle (handle.py) reads it for the ports and the status
socket, and waits on `wait_change()`. The connector states are the ones the
status socket shows (docs/operations.md). Which may follow which is data
(`TRANSITIONS`); each change is logged once, as the state's canonical line
(`STATE_EVENTS`). The live states (handshaking, policy_pending, ready,
mcp_only) follow the connection's own `Mode`, which
`McplConnection(on_mode=lifecycle.mode_entered)` reports the moment the
protocol layer assigns it.

A restart asked for (`mcplhost restart-connector`, through the handle's
`restart()`) is a request the supervisor takes: `restartable()` is the life
or wait it cuts short, `take_restart()` says whether one was asked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

import anyio
import structlog

from mcplhost.protocol.connection import McplConnection, Mode
from mcplhost.protocol.ports import SERVING, ConnectorStopped, State

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


class Lifecycle:
    """One connector's state and current life, for the host's whole run. Written by `supervise` only.

    `on_change` runs after every state change (the host's STATUS= line);
    `on_wake` whenever waiters should look again (the quiet watcher's activity).
    """

    def __init__(self, name: str, *, monotonic: Callable[[], float], on_change: Callable[[], None],
                 on_wake: Callable[[], None]) -> None:
        self.name = name
        self._monotonic = monotonic
        self._on_change = on_change
        self._on_wake = on_wake
        self._log = log.bind(connector=name)
        self._state = State.STARTING
        self._changed = anyio.Event()  # set, and replaced, at every change a waiter may care about
        self._connection: McplConnection | None = None  # while a life serves or is about to
        self._pid: int | None = None
        self._lives = 0
        self._last_error: str | None = None
        self._serving_since: float | None = None  # monotonic: when this life began serving (None: it does not)
        self._restart_scope: anyio.CancelScope | None = None  # the life or wait `request_restart()` cuts short
        self._restart_requested = False

    # --- read by the handle ----------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def connection(self) -> McplConnection | None:
        """The current life's connection while calls may go through it (None once the life is ending)."""
        return self._connection

    @property
    def pid(self) -> int | None:
        """The current life's process id (None while no process runs)."""
        return self._pid

    @property
    def lives(self) -> int:
        """Process lives started since the host started (a reload's new handle goes on counting)."""
        return self._lives

    @property
    def last_error(self) -> str | None:
        """Why the latest life ended (or never began)."""
        return self._last_error

    @property
    def serving_since(self) -> float | None:
        """Monotonic time this life began serving (ready or mcp_only); None while it does not serve."""
        return self._serving_since

    async def wait_change(self) -> None:
        """Wait for the next state change, channel change, or end of a life's calls."""
        await self._changed.wait()

    def carry_over(self, previous: Lifecycle) -> None:
        """Continue `previous`'s lives and last error (before this one's first life): a reload's new handle."""
        self._lives = previous._lives  # this handle's first start counts as one more restart
        self._last_error = previous._last_error

    # --- restart-connector -------------------------------------------------------------

    def request_restart(self) -> None:
        """Ask the supervisor to end the current life, or the wait before the next, now (ConnectorStopped: it
        stopped for good, nothing would start it)."""
        if self._state is State.STOPPED:
            raise ConnectorStopped(self.name, self._state, "it stopped for good in this run of the host"
                                   + (f" ({self._last_error})" if self._last_error else ""))
        self._restart_requested = True
        if self._restart_scope is not None:
            self._restart_scope.cancel()

    @contextmanager
    def restartable(self) -> Iterator[None]:
        """The supervisor's current life or wait, which a restart request cuts short (one asked just before
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
        """Whether a restart was asked since the last call; if so, the next start is logged as asked for."""
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

    # --- the life, as supervise drives it ------------------------------------------------

    def starting(self) -> None:
        """A new process life begins (the first, or a restart)."""
        self._lives += 1
        self._enter(State.STARTING, restarts=max(self._lives - 1, 0))

    def spawned(self, pid: int, connection: McplConnection, **fields: Any) -> None:
        """The process runs and `connection` (built with `on_mode=lifecycle.mode_entered`) speaks to it."""
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

    def channels_changed(self) -> None:
        """The life's registered channels changed (the connection says so): waiters look again."""
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

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
            self._serving_since = self._monotonic()
        event, default_level = STATE_EVENTS[state]
        getattr(self._log, level or default_level)(event, state=state.value, previous=previous.value, **fields)
        self._wake()
        self._on_change()

    def _wake(self) -> None:
        """Let every waiter look again."""
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        self._on_wake()
