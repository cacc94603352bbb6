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
) -> dict[str, Any]:
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
    if kind not in _LANES_OF_KIND:
        raise ValueError(f"unknown source kind {kind!r}; expected one of {KINDS}")
    if lane not in _LANES_OF_KIND[kind]:
        raise ValueError(f"a {kind!r} item cannot arrive on lane {lane!r}")
    if not isinstance(server_id, str) or not server_id:
        raise ValueError("server_id must be the connector's configured, non-empty name")
    if kind == "channel" and channel_id is None:
        raise ValueError("a channel item needs its registered channel_id")
    if kind == "unscoped" and channel_id is not None:
        raise ValueError("an unscoped item names no channel")
    if isinstance(accepted_at, bool) or not isinstance(accepted_at, int):
        raise TypeError("accepted_at must be epoch milliseconds as an int")

    envelope: dict[str, Any] = {
        "kind": kind,
        "lane": lane,
        "serverId": server_id,
        "channelId": channel_id,
        "label": label,
        "threadId": thread_id,
        "messageId": message_id,
        "eventId": event_id,
        "replyTo": reply_to,
        "acceptedAt": accepted_at,
        "sourceTimestamp": source_timestamp,
    }
    return {key: value for key, value in envelope.items() if value is not None}
