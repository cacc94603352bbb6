"""The consecutive-wake count: the loop breaker that counts turns agents cause (docs/peers.md#loops); pure.

A wake is *caused by an agent* when its items are peer messages (other than
an ancestor's guidance) or chat items that are another agent's speech of
this host coming back through a chat connector (two agents answering each
other in a channel). Any user input (a chat item that is not such speech, a
line typed at the console) or an ancestor's guidance resets the count; a
push (a timer, a webhook) leaves it as it is. The count is per agent and
durable (mcplhost/store/peers.py), so a restart does not reset it.

At CONSECUTIVE_WAKES_MAX, peer sends to the agent are refused
(`needs_attention`) and a wake that agents alone caused is held (no turn),
whichever route the loop takes, until a user or a parent speaks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from mcplhost.inbound.notice import reader_text
from mcplhost.inbound.source import PUSH_LANE
from mcplhost.peers.limits import CONSECUTIVE_WAKES_MAX
from mcplhost.store.items import StoredItem
from mcplhost.store.rows import PeerMeta, SurfaceSource

Cause = Literal["user", "parent", "agent", "other"]

#: The agent of this host that recently spoke exactly this text, or None (the outbox's window of deliveries).
Speaker = Callable[[str], "str | None"]


def item_cause(agent: str, item: StoredItem, speaker: Speaker) -> Cause:
    """What one waking item says about who caused the wake."""
    host, source = item.host, item.meta.source
    if item.agent is not None:
        if item.agent == agent and item.role == "user" and isinstance(host, PeerMeta):
            return "parent" if host.peer.relationship == "ancestor" else "agent"
        return "other"
    if isinstance(source, SurfaceSource):
        return "user"
    if source is not None and source.lane == PUSH_LANE:
        return "other"
    spoken_by = speaker(reader_text(item.content, item.meta.source_header))
    return "agent" if spoken_by is not None and spoken_by != agent else "user"


def wake_cause(agent: str, items: Sequence[StoredItem], speaker: Speaker) -> Cause:
    """The wake's cause: user or parent input wins (it resets), then an agent, else other."""
    causes = {item_cause(agent, item, speaker) for item in items}
    for cause in ("user", "parent", "agent"):
        if cause in causes:
            return cause
    return "other"


def next_count(count: int, cause: Cause) -> int:
    """The consecutive-wake count after a turn of this cause starts."""
    if cause in ("user", "parent"):
        return 0
    return count + 1 if cause == "agent" else count


def held(count: int, cause: Cause, *, admitted_peer_rows: bool) -> bool:
    """Whether the wake is held: agents alone caused it and the count is at the cap.

    Peer rows already admitted (answered `accepted` or `queued` before the
    cap was reached) still run: the sender was told they would be delivered.
    """
    return cause == "agent" and count >= CONSECUTIVE_WAKES_MAX and not admitted_peer_rows
