"""Stop commands: the pure rule that says whether an item stops an agent (docs/agents.md#stop).

    if is_stop_command(agent, stored.item): ...

An item is a stop for agent X when all of these hold:

- it is a channel item X hears, not an echo of this host's own publish and
  not an agent's row;
- its sender matches one of X's `control_from` entries (`CONNECTOR/AUTHOR-ID-GLOB`,
  matched like `wake_from` against the connector name and `metadata.authorId`;
  empty, the default, matches no one);
- its body's text (the stored source header left out), trimmed and case-folded, equals one of X's `stop_commands`, also
  trimmed and case-folded.

The rule reads only the item and the agent's settings, so each agent's loop
(agents/agent_loop.py) and `mcplhost explain` decide alike. An item that is a
stop for X wakes X never; for an agent that does not obey its sender it is
an ordinary item.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any, Protocol

from mcplhost.agents.wakes.rules import hears, is_echo, view_of
from mcplhost.config import AgentConfig
from mcplhost.inbound.notice import reader_text
from mcplhost.ingest import Stored
from mcplhost.store import NewItem
from mcplhost.store.rows import ItemMeta

#: Longest body (its stored header aside) compared against the stop commands; a longer one is no command.
MAX_STOP_TEXT_CHARS = 200
#: The wake decision recorded for each pending item a stop dropped (one of store/decisions.py's reasons).
DROPPED_BY_STOP = "dropped_by_stop"
#: The `metadata.source.kind` of a channel message, the only kind a stop may come as.
CHANNEL_KIND = "channel"


class ItemFields(Protocol):
    """What the rule reads of an item: a `NewItem` (a `Stored` event's) or a `StoredItem` (a row read back)."""

    @property
    def content(self) -> Any: ...
    @property
    def metadata(self) -> Any: ...
    @property
    def agent(self) -> str | None: ...
    @property
    def role(self) -> str: ...


def command_text(content: Any, meta: ItemMeta) -> str | None:
    """The body's text without its stored header, trimmed and case-folded; None when it is too long to be one."""
    if not isinstance(content, list):
        return None
    size = sum(len(block["text"]) for block in content
               if isinstance(block, dict) and isinstance(block.get("text"), str))
    header = meta.source_header
    if size > MAX_STOP_TEXT_CHARS + (len(header) if header is not None else 0):
        return None  # read no further: no command is that long
    return reader_text(content, header).strip().casefold()


def normalized_commands(commands: Iterable[str]) -> frozenset[str]:
    """The configured stop commands as compared: trimmed and case-folded."""
    return frozenset(command.strip().casefold() for command in commands)


def controls(agent: AgentConfig, server_id: str | None, author_id: str | None) -> bool:
    """Whether the sender (connector name and author id) is in the agent's `control_from`."""
    if server_id is None or author_id is None:
        return False
    for entry in agent.control_from:
        name, _, glob = entry.partition("/")
        if name == server_id and fnmatchcase(author_id, glob):
            return True
    return False


def is_stop_command(agent: AgentConfig, item: ItemFields) -> bool:
    """Whether `item` (a `NewItem` or a `StoredItem`) is a stop command for `agent` (see the module's docstring).

    Pure: it reads the item's metadata (`serverId`, `authorId`, `source.kind`,
    tags, `echoOf`), its text blocks and the agent's `hears`, `control_from`
    and `stop_commands`.
    """
    if not agent.control_from or not agent.stop_commands:
        return False
    fields = item if isinstance(item, NewItem) else NewItem(role=item.role, content=[], created_at=0,
                                                            metadata=item.metadata, agent=item.agent)
    view = view_of(Stored(0, fields))
    if view.agent is not None or view.source_kind != CHANNEL_KIND or is_echo(view):
        return False
    if not controls(agent, view.server_id, view.author_id) or not hears(agent, view):
        return False
    text = command_text(item.content, fields.meta)
    return text is not None and text in normalized_commands(agent.stop_commands)
