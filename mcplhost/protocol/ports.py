"""The ports the layers above the protocol call a connector through.

Speech and agents never import the supervisor: they call a connector
through `ConnectorPort`, which the supervisor's `ConnectorHandle`
(mcplhost/supervisor/handle.py) implements and the host hands in
(docs/architecture.md#layers). The port's states and refusals are declared
here, beside it, so a caller can name what it catches without reaching up.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Protocol

from msgspec import UNSET

from .answers import ListedTool, OpenedChannel
from .channels import Channel


class State(Enum):
    """A configured connector's state, as the status socket shows it (docs/operations.md)."""

    STARTING = "starting"  # about to spawn the process
    HANDSHAKING = "handshaking"  # spawned; initialize not answered yet
    POLICY_PENDING = "policy_pending"  # initialized; the first featureSets/update awaits its receipt
    READY = "ready"  # MCPL in force under the grant
    MCP_ONLY = "mcp_only"  # serving plain MCP only: no manifest, or the policy fell back
    BACKOFF = "backoff"  # the life ended; the next start waits its delay
    SLOW_LANE = "slow_lane"  # crash loop: one start every backoff_max_s until it stays up
    STOPPED = "stopped"  # no more starts in this run of the host


#: The states in which host-initiated calls go through (while the life's connection lasts).
SERVING = frozenset({State.READY, State.MCP_ONLY})


class ConnectorNotReady(Exception):
    """The connector is not serving (starting, in backoff, stopped...); nothing was sent."""

    def __init__(self, name: str, state: State, why: str) -> None:
        super().__init__(f"connector {name}: {why}")
        self.name = name
        self.state = state  # when it was raised


class ConnectorGone(ConnectorNotReady):
    """The process life ended while the call waited: it may or may not have been handled."""


class ConnectorStopped(ConnectorNotReady):
    """The connector stopped for good; it will not be ready again in this run of the host."""


class ConnectorPort(Protocol):
    """One configured connector, for the host's whole run, across its restarts.

    Reads say what is in force now; calls go through only while it serves,
    else `ConnectorNotReady` (`ConnectorGone` when the life ends mid-call).
    """

    @property
    def name(self) -> str: ...

    @property
    def state(self) -> State: ...

    @property
    def grant(self) -> frozenset[str]: ...

    def channels(self) -> list[Channel]: ...

    def channel(self, channel_id: str) -> Channel | None: ...

    def tools(self) -> list[ListedTool]: ...

    async def request(self, method: str, params: Any = UNSET, *, timeout: float | None = None,
                      result_type: Any = Any) -> Any: ...

    async def request_with_grant(self, method: str, params: Any = UNSET, *, timeout: float | None = None,
                                 result_type: Any = Any) -> tuple[Any, frozenset[str]]: ...

    async def notify(self, method: str, params: Any = UNSET) -> None: ...

    async def open_channel(self, channel_id: str, *, timeout: float | None = None) -> OpenedChannel: ...

    async def wait_state(self, *states: State) -> State: ...

    async def wait_ready(self) -> None: ...
