"""Which inbound method needs which capability: the authorization table (SPEC §14.1, §5.4).

One table, read by `McplConnection` for every request and notification a
connector sends. A method missing from the table is unknown (-32601).
"""

from __future__ import annotations

from typing import NamedTuple


class MethodRule(NamedTuple):
    capability: str | None  # None: ungated; gated methods are refused until the policy receipt


#: Server → host methods mcplhost understands.
INBOUND: dict[str, MethodRule] = {
    "ping": MethodRule(None),
    "mcpl/manifestChanged": MethodRule(None),  # deliberately ungated (§17)
    "push/event": MethodRule("pushEvents"),
    "inference/request": MethodRule("inferenceRequest"),
    "model/info": MethodRule("modelInfo"),
    "channels/register": MethodRule("channels.register"),
    "channels/changed": MethodRule("channels.register"),
    "channels/list": MethodRule("channels.register"),
    "channels/incoming": MethodRule("channels.incoming"),
}

#: Removed in 0.5: answered -32601 as unknown, ignored as notifications.
REMOVED = frozenset({"featureSets/changed", "scope/elevate", "context/afterInference"})

#: MCP notifications a server may send; accepted and logged, never answered.
MCP_NOTIFICATIONS_PREFIX = "notifications/"


def rule_for(method: str) -> MethodRule | None:
    """The rule for `method`, or None when it is unknown or removed."""
    if method in REMOVED:
        return None
    return INBOUND.get(method)
