"""Which inbound method needs which capability: the authorization table (SPEC §14.1, §5.4).

One table, read by `McplConnection` for every request and notification a
connector sends. A method missing from the table is unknown (-32601).
"""

from __future__ import annotations

from typing import NamedTuple


class MethodRule(NamedTuple):
    capability: str | None  # None: ungated
    privileged: bool  # refused while the initial policy is pending


#: Server → host methods mcplhost understands.
INBOUND: dict[str, MethodRule] = {
    "ping": MethodRule(None, False),
    "mcpl/manifestChanged": MethodRule(None, False),  # deliberately ungated (§17)
    "push/event": MethodRule("pushEvents", True),
    "inference/request": MethodRule("inferenceRequest", True),
    "model/info": MethodRule("modelInfo", True),
    "channels/register": MethodRule("channels.register", True),
    "channels/changed": MethodRule("channels.register", True),
    "channels/list": MethodRule("channels.register", True),
    "channels/incoming": MethodRule("channels.incoming", True),
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
