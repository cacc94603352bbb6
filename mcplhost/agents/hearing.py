"""What an agent hears, by connector and channel: its `hears` entries (docs/agents.md#wakes).

    heard_by(agent.hears, "chat", "general")      # an item from there is in the agent's context
    heard_connectors(handles, agent)             # the handles of the connectors it hears, in config order

Entries are `connector` or `connector/channel-glob`; no `hears` hears every
connector. The compiler, the hooks and the tools all ask here, so they agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any, TypeVar

from mcplhost.config import AgentConfig

#: Whatever a caller holds of each connector (heard_connectors reads only the map's names).
Port = TypeVar("Port")


def heard_connectors(handles: Mapping[str, Port], agent: AgentConfig) -> list[Port]:
    """The handles of the connectors the agent hears, in config order (no `hears`: every connector)."""
    if not agent.hears:
        return list(handles.values())
    names = {entry.split("/", 1)[0] for entry in agent.hears}
    return [handle for name, handle in handles.items() if name in names]


def heard_by(hears: list[str] | None, server_id: Any, channel_id: Any) -> bool:
    """Whether an item from (server, channel) is heard: `hears` entries are `connector` or `connector/channel-glob`.

    No `hears` (None or empty) hears every connector. A glob never matches
    an item without a channel (an unscoped push).
    """
    if not hears:
        return True
    for entry in hears:
        connector, slash, glob = entry.partition("/")
        if server_id != connector:
            continue
        if not slash or (isinstance(channel_id, str) and fnmatchcase(channel_id, glob)):
            return True
    return False
