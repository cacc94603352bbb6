"""freeze-source: the envelope recording, once, where an item came from.

docs/provenance.md §2. The envelope is built at acceptance from what the host
knows (its own name for the connector, the registered channel, its clock)
and stored as `metadata.source`; nothing re-derives it later, so a rename,
reconnect, restart or replay never rewrites it. Optional fields the item
does not have are absent, never invented.

Choosing the values (the configured connector name, the canonical channel
id, a correction's inherited thread) is the caller's job; this function only
checks that the kind, lane and channel agree and lays the envelope out.
"""

from __future__ import annotations

from typing import Any

from mcplhost.jsonobject import JsonObject

__all__ = ["INCOMING_LANE", "KINDS", "LANES", "PUSH_LANE", "SURFACE_LANE", "freeze_source"]

KINDS = ("channel", "unscoped", "surface")
INCOMING_LANE = "channels/incoming"  # a channel's messages
PUSH_LANE = "push/event"
SURFACE_LANE = "surface"  # local console input, which arrives on no MCPL lane
LANES = (INCOMING_LANE, PUSH_LANE, SURFACE_LANE)

# Which lanes each kind arrives on. Local console input has no MCPL lane;
# it gets the lane "surface" so every envelope names one.
_LANES_OF_KIND: dict[str, frozenset[str]] = {
    "channel": frozenset({"channels/incoming", "push/event"}),
    "unscoped": frozenset({"push/event"}),
    "surface": frozenset({"surface"}),
}


def freeze_source(
    *,
    kind: str,
    lane: str,
    server_id: str,
    accepted_at: int,
    channel_id: str | None = None,
    label: str | None = None,
    thread_id: str | None = None,
    message_id: str | None = None,
    event_id: str | None = None,
    reply_to: str | None = None,
    source_timestamp: Any = None,
) -> JsonObject:
    """The frozen source envelope, with `None` fields left out.

    - `kind`: "channel", "unscoped" (a push naming no channel) or "surface"
      (local console input).
    - `lane`: "channels/incoming" or "push/event"; "surface" for console
      input, which arrives on no MCPL lane.
    - `server_id`: the connector's name as the host's config names it.
    - `channel_id`: the registered, canonical channel id; required for a
      channel item, refused for an unscoped one.
    - `accepted_at`: host time, epoch milliseconds.
    - `source_timestamp`: the connector's own timestamp, kept verbatim.

    Raises ValueError or TypeError for a combination the host should never
    build (these are host bugs, not a connector's fault).
    """
    lanes = _LANES_OF_KIND.get(kind)
    if lanes is None:
        raise ValueError(f"unknown source kind {kind!r}; expected one of {KINDS}")
    if lane not in lanes:
        raise ValueError(f"a {kind!r} item cannot arrive on lane {lane!r}")
    if not isinstance(server_id, str) or not server_id:
        raise ValueError("server_id must be the connector's configured, non-empty name")
    if kind == "channel":
        if channel_id is None:
            raise ValueError("a channel item needs its registered channel_id")
    elif kind == "unscoped" and channel_id is not None:
        raise ValueError("an unscoped item names no channel")
    if type(accepted_at) is not int and (isinstance(accepted_at, bool) or not isinstance(accepted_at, int)):
        raise TypeError("accepted_at must be epoch milliseconds as an int")

    # Laid out in the envelope's order, optional fields only when the item has them (built
    # directly: this runs for every inbound item).
    envelope: dict[str, Any] = {"kind": kind, "lane": lane, "serverId": server_id}
    if channel_id is not None:
        envelope["channelId"] = channel_id
    if label is not None:
        envelope["label"] = label
    if thread_id is not None:
        envelope["threadId"] = thread_id
    if message_id is not None:
        envelope["messageId"] = message_id
    if event_id is not None:
        envelope["eventId"] = event_id
    if reply_to is not None:
        envelope["replyTo"] = reply_to
    envelope["acceptedAt"] = accepted_at
    if source_timestamp is not None:
        envelope["sourceTimestamp"] = source_timestamp
    return envelope
