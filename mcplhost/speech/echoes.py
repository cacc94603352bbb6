"""Echo suppression (docs/agents.md#echoes): knowing this host's own words when they come back.

A platform shows the bot its own message: Discord sends it back on the
gateway, many bridges tag it `chat:from-self`. Such an item is still stored
(it is part of the conversation), but marked so it wakes no one:
`metadata.echoOf` = the outbox id of the publish it echoes (or `true` when
only the `chat:from-self` tag says so), plus the host tag `host:echo`.

Ingest reaches this knowledge through its echo port (mcplhost/ingest/ports.py);
`EchoMemory` below implements it. The lookup is memory only, so it is cheap:
the outbox repository's bounded window of recent deliveries (store/outbox.py
`recent_delivered`, the last RECENT_DELIVERED), fed by the sender as each
publish is answered and, at the host's first inbound item, seeded from the
outbox table (`load_recent_delivered`: the deliveries of the last
ECHO_WINDOW_MS), so an echo arriving after a restart is still known. An echo
can also arrive before its publish is answered: the runtime checks the
waking items again against the same window when the wake fires
(agents/runtime.py), by which time the delivery is usually remembered. An
echo of a delivery older than the window is not recognised by its
messageId; only a `chat:from-self` tag marks it then.

Only host-written fields are read (`metadata.serverId`, `channelId`,
`messageId`, `tags`); the connector's `metadata.adapter` is never consulted,
and a `host:echo` tag a connector sends itself is dropped, so the tag always
means the host decided it (docs/provenance.md §1: nothing that decides what an item
is comes from the connector's claims).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcplhost.store.interfaces import Outbox
from mcplhost.store.rows import ItemMeta, item_meta

#: The host tag on a stored echo. The `host:` namespace is the host's; connectors' tags in it are dropped.
ECHO_TAG = "host:echo"
FROM_SELF = "chat:from-self"

#: (connector, channel id, platform messageId) → the outbox id of the delivered publish, or None.
Lookup = Callable[[str, str, str], "int | None"]


def echo_key(meta: ItemMeta) -> tuple[str, str, str] | None:
    """(connector, channel, messageId) of a stored item's host-written fields; None when one is missing."""
    if meta.server_id is None or meta.channel_id is None or meta.message_id is None:
        return None
    return meta.server_id, meta.channel_id, meta.message_id


def echo_of(meta: ItemMeta, lookup: Lookup | None) -> int | bool | None:
    """What `metadata.echoOf` should say of an inbound item: the outbox id, True (only tagged), or None."""
    key = echo_key(meta)
    if lookup is not None and key is not None:
        outbox_id = lookup(*key)
        if outbox_id is not None:
            return outbox_id
    return True if FROM_SELF in meta.tags else None


def marked(metadata: dict[str, Any], lookup: Lookup | None) -> dict[str, Any]:
    """`metadata` (an inbound item's, about to be stored) with the echo mark when the item is an echo; a
    connector's own `host:echo` tag dropped.

    Returns `metadata` itself when there is nothing to change (the common case costs no copy, and is told
    from the dict alone: no typed read per inbound item).
    """
    if _plainly_unmarked(metadata, lookup):
        return metadata
    meta = item_meta(metadata)
    forged = ECHO_TAG in meta.tags
    echo = echo_of(meta, lookup)
    if echo is None and not forged:
        return metadata
    kept = [t for t in meta.tags if t != ECHO_TAG]
    result = dict(metadata, tags=kept)
    if echo is not None:
        result["echoOf"] = echo
        result["tags"] = [*kept, ECHO_TAG]
    return result


def _plainly_unmarked(metadata: dict[str, Any], lookup: Lookup | None) -> bool:
    """True when `marked` would change nothing, judged from the dict's exact types; False: not plain, read it typed.

    A `tags` list holding neither tag, and ids that are str or absent (no key, or a key the lookup does not
    know): then the typed read finds no echo and nothing forged either.
    """
    tags = metadata.get("tags")
    if type(tags) is not list or ECHO_TAG in tags or FROM_SELF in tags:
        return False
    if lookup is None:
        return True
    server_id, channel_id, message_id = metadata.get("serverId"), metadata.get("channelId"), metadata.get("messageId")
    if type(server_id) is str and type(channel_id) is str and type(message_id) is str:
        return lookup(server_id, channel_id, message_id) is None
    # A missing id: no key to look up. One of another type: read it typed.
    return all(value is None or type(value) is str for value in (server_id, channel_id, message_id))


class EchoMemory:
    """Ingest's echo port (mcplhost/ingest/ports.py) over the outbox repository's window of recent deliveries."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox

    async def seed(self, now_ms: int) -> int:
        return await self._outbox.load_recent_delivered(now_ms)

    def marked(self, metadata: dict[str, Any]) -> dict[str, Any]:
        return marked(metadata, self._outbox.recent_delivered)
