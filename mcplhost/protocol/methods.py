"""Every method a connector may send us, in one table: capability, and handler per kind (SPEC §14.1, §5.4).

`McplConnection` reads this table for every request and notification, and
hands each handler itself as the `context.Inbound` it needs. A
method missing from it (or removed in 0.5) is unknown: a request gets
-32601, a notification is warned about once and ignored. A method present
with no handler for the kind that arrived is refused the same way: a
request without a request handler gets -32601, a notification without a
notification handler is warned about once.

The capability is checked first, against the grant in force at receipt;
`None` means ungated.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from msgspec import Raw, UnsetType

from . import handlers
from .context import Inbound

#: Answers a request: a result, or a `Deferred` whose work yields the result.
RequestHandler = Callable[[Inbound, Raw | UnsetType], Any]
#: Handles a notification; nothing is answered.
NotificationHandler = Callable[[Inbound, Raw | UnsetType], Awaitable[None]]


class Method(NamedTuple):
    capability: str | None  # None: ungated; gated methods are refused until the policy receipt
    request: RequestHandler | None  # None: not valid as a request (-32601)
    notification: NotificationHandler | None  # None: not valid as a notification (warned once)


#: Server → host methods mcplhost understands.
INBOUND: dict[str, Method] = {
    "ping": Method(None, handlers.ping, None),
    "mcpl/manifestChanged": Method(None, None, handlers.manifest_changed),  # deliberately ungated (SPEC §17)
    "push/event": Method("pushEvents", handlers.push_event, None),
    # Offered only when [inference] is configured (grants.offered_paths).
    "inference/request": Method("inferenceRequest", handlers.inference_request, None),
    "model/info": Method("modelInfo", handlers.model_info, None),
    "channels/register": Method("channels.register", handlers.register, None),
    "channels/changed": Method("channels.register", handlers.changed, handlers.changed_notification),
    "channels/list": Method("channels.register", handlers.list_channels, None),
    "channels/incoming": Method("channels.incoming", handlers.incoming, handlers.incoming_notification),
}

#: Removed in 0.5: answered -32601 as unknown, ignored as notifications.
REMOVED = frozenset({"featureSets/changed", "scope/elevate", "context/afterInference"})

#: MCP notifications a server may send; accepted and logged, never answered.
MCP_NOTIFICATIONS_PREFIX = "notifications/"

#: The MCP notifications the host acts on (ungated: what they trigger checks the grant itself);
#: every other `notifications/...` is accepted and ignored.
MCP_NOTIFICATIONS: dict[str, NotificationHandler] = {
    "notifications/tools/list_changed": handlers.tools_list_changed,
    "notifications/cancelled": handlers.cancelled,
}


def method_for(name: str) -> Method | None:
    """The table entry for `name`, or None when it is unknown or removed."""
    if name in REMOVED:
        return None
    return INBOUND.get(name)
