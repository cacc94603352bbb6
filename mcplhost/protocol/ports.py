"""The ports between the protocol layer and the layers above it (docs/architecture.md#ports).

Speech and agents never import the supervisor: they call a connector
through the narrow port each caller needs (`OutboxPort` for the outbox
sender, `HookPort` for hooks and lifecycle, `ToolPort` for the tool box,
`NotifyPort` for typing and streaming, ...), which the supervisor's
`ConnectorHandle` (mcplhost/supervisor/handle.py) implements and the host
hands in. The other way round, the protocol layer serves
`inference/request` and `model/info` through `InferenceService` and asks
`PendingHooks` for the loop guard; mcplhost/agents implements both and the
host wires them in, so protocol/ never imports agents. Each port's states
and refusals are declared here, beside it, so a caller can name what it
catches without reaching up.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from enum import Enum
from typing import Any, Protocol

import msgspec
from msgspec import UNSET

from mcplhost.jsonobject import JsonObject
from mcplhost.rpc.errors import LineTooLong, RemoteError, RequestTimeout

from .answers import ListedTool, MalformedAnswer, OpenedChannel
from .channels import Channel
from .params import InferenceRequest


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


#: What `notify` raises when nothing (or not all) went out: the connector does not serve or its life ended
#: (`ConnectorNotReady`), or the line would pass the connector's cap (`LineTooLong`, nothing written).
NOTIFY_FAILURES: tuple[type[Exception], ...] = (ConnectorNotReady, LineTooLong)
#: What `request` raises when it brought no usable answer: NOTIFY_FAILURES (not sent, or the life ended
#: before the answer: `ConnectorGone`), the connector's error answer (`RemoteError`), no answer in time
#: (`RequestTimeout`), or an answer of another shape than the one asked for (`msgspec.ValidationError`,
#: `MalformedAnswer`).
REQUEST_FAILURES: tuple[type[Exception], ...] = (
    *NOTIFY_FAILURES, RemoteError, RequestTimeout, msgspec.ValidationError, MalformedAnswer)


# --- one connector, as each caller reaches it (implemented by mcplhost/supervisor/handle.py) -------------
#
# One configured connector for the host's whole run, across its restarts. Reads say what is in force now;
# calls go through only while it serves, else `ConnectorNotReady` (`ConnectorGone` when the life ends
# mid-call). Each caller names the port with the members it uses, so a test double is a few lines and
# the type checker holds every caller to its port.


class ChannelPatterns(Protocol):
    """The operator's channel patterns for a connector (its config's `channels`; None: any channel)."""

    @property
    def channels(self) -> Sequence[str] | None: ...


class NotifyPort(Protocol):
    """Typing, streaming and lifecycle notifications: sent while the connector is ready and holds their path."""

    @property
    def state(self) -> State: ...

    @property
    def grant(self) -> frozenset[str]: ...

    async def notify(self, method: str, params: Any = UNSET) -> None:
        """Raises one of NOTIFY_FAILURES when it did not go out."""
        ...


class AcknowledgePort(Protocol):
    """`channels/acknowledge` (mcplhost/agents/turns/acknowledge.py): a request while ready and granted."""

    @property
    def state(self) -> State: ...

    @property
    def grant(self) -> frozenset[str]: ...

    async def request(self, method: str, params: Any = UNSET, *, timeout: float | None = None,
                      result_type: Any = Any) -> Any: ...


class HookPort(Protocol):
    """`context/beforeInference` and `inference/lifecycle` (mcplhost/agents/turns/hooks.py)."""

    @property
    def name(self) -> str: ...

    @property
    def state(self) -> State: ...

    @property
    def grant(self) -> frozenset[str]: ...

    async def request_with_grant(self, method: str, params: Any = UNSET, *, timeout: float | None = None,
                                 result_type: Any = Any) -> tuple[Any, frozenset[str]]: ...

    async def notify(self, method: str, params: Any = UNSET) -> None: ...


class CatchUpPort(Protocol):
    """Catch-up's wait for a restarted connector's channels (mcplhost/agents/wakes/catchup.py)."""

    def channel(self, channel_id: str) -> Channel | None: ...

    async def wait_channel(self, channel_id: str) -> bool: ...  # True once registered; False: it gave up


class ChannelListing(Protocol):
    """The channels an agent may be routed to, as the speech router lists them (mcplhost/speech/routing.py)."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> ChannelPatterns: ...

    @property
    def grant(self) -> frozenset[str]: ...

    def channels(self) -> list[Channel]: ...


class PublishCheck(Protocol):
    """Whether a connector may publish to one channel now (mcplhost/speech/routing.py `publish_refusal`)."""

    @property
    def spec(self) -> ChannelPatterns: ...

    @property
    def grant(self) -> frozenset[str]: ...

    def channel(self, channel_id: str) -> Channel | None: ...


class OutboxPort(PublishCheck, Protocol):
    """One connector's outbox sender (mcplhost/speech/outbox.py): publishes, one life at a time."""

    @property
    def name(self) -> str: ...

    @property
    def lives(self) -> int: ...  # process lives started so far: a new number is a new life

    async def wait_ready(self) -> None: ...  # ConnectorStopped once it cannot be ready again

    async def request(self, method: str, params: Any = UNSET, *, timeout: float | None = None,
                      result_type: Any = Any) -> Any: ...

    def published(self) -> None: ...  # a channels/publish was delivered now (its status shows lastPublishAt)


class ToolCallPort(Protocol):
    """A connector's MCP tools as an agent calls them (mcplhost/agents/tools/toolbox.py)."""

    @property
    def name(self) -> str: ...

    def tools(self) -> list[ListedTool]: ...

    async def request(self, method: str, params: Any = UNSET, *, timeout: float | None = None,
                      result_type: Any = Any) -> Any: ...

    async def notify(self, method: str, params: Any = UNSET) -> None: ...  # notifications/cancelled


class ChannelOpenPort(Protocol):
    """The channel tools (`channel_list`, `channel_open` with its backscroll; mcplhost/agents/tools/toolbox.py)."""

    @property
    def name(self) -> str: ...

    @property
    def grant(self) -> frozenset[str]: ...

    def channels(self) -> list[Channel]: ...

    def channel(self, channel_id: str) -> Channel | None: ...

    async def open_channel(self, channel_id: str, *, timeout: float | None = None,
                           history: int = 0) -> OpenedChannel: ...

    async def notify(self, method: str, params: Any = UNSET) -> None: ...  # notifications/cancelled


class ToolPort(ToolCallPort, ChannelOpenPort, Protocol):
    """What an agent's tool box holds of each connector: its tools and its channels."""


# --- the ports the protocol layer calls (implemented in mcplhost/agents) --------------------

#: Sends one `inference/chunk` notification's params to the connector (awaits the pipe).
SendChunk = Callable[[dict[str, Any]], Awaitable[None]]


class InferenceInvalid(Exception):
    """The request's messages cannot become a model request; the text says which and why (a -32602)."""


class InferenceRefused(Exception):
    """The inference service will not serve a request (busy), or its backend failed.

    `reason` is what the wire error's data carries; `detail` is for the message and the log.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class InferenceCall(Protocol):
    """One admitted `inference/request`: it holds one of its connector's places until `release`."""

    async def run(self, *, request_id: Any, send_chunk: SendChunk) -> JsonObject:
        """The wire result; streamed chunks (`stream: true`) all go out first. InferenceRefused when the backend fails."""

    def release(self) -> None:
        """Give the place back (idempotent): when the request ends, is cancelled, or never starts."""


class InferenceService(Protocol):
    """The `[inference]` backend as connectors reach it (docs/agents.md#inference); one per host."""

    def model_info(self) -> JsonObject:
        """The `model/info` result (ModelInfo)."""

    def admit(self, connector_name: str, request: InferenceRequest) -> InferenceCall:
        """Admit `request` at receipt, so a burst read in one chunk cannot overrun the bound.

        Raises InferenceInvalid for messages no model request can carry, and
        InferenceRefused when the connector may not start another request now.
        """


class PendingHooks(Protocol):
    """The loop guard's question (docs/mcpl-checklist.md item 31)."""

    def hook_pending(self, connector_name: str) -> bool:
        """Whether a `context/beforeInference` call to this connector is outstanding now."""


class NoPendingHooks:
    """`PendingHooks` for a host whose agents call no hooks (or that has none)."""

    def hook_pending(self, connector_name: str) -> bool:
        return False
