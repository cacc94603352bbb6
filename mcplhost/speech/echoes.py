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
can also arrive before its publish is answered: each agent's loop checks the
waking items again against the same window when the wake fires
(agents/agent_loop.py), by which time the delivery is usually remembered. An
echo of a delivery older than the window is not recognised by its
messageId; only a `chat:from-self` tag marks it then.

Only host-written fields are read (`metadata.serverId`, `channelId`,
`messageId`, `tags`: at ingest, typed, from the delivered item they are
written from); the connector's `metadata.adapter` is never consulted,
and a `host:echo` tag a connector sends itself is dropped, so the tag always
means the host decided it (docs/provenance.md §1: nothing that decides what an item
is comes from the connector's claims).
"""

from __future__ import annotations

from collections.abc import Callable

from msgspec.structs import replace

from mcplhost.inbound.pipeline import Processed
from mcplhost.store.interfaces import Outbox
from mcplhost.store.rows import ItemMeta

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


def marked(processed: Processed, lookup: Lookup | None) -> Processed:
    """`processed` (an inbound item about to be stored) with the echo mark when it is an echo; a connector's
    own `host:echo` tag dropped. Returns `processed` itself when there is nothing to change.

    Read from the delivered item's typed ids, which are the ones its metadata holds.
    """
    d = processed.delivered
    forged = ECHO_TAG in d.tags
    echo: int | bool | None = None
    if lookup is not None and d.channel_id is not None and d.message_id is not None:
        echo = lookup(d.server_id, d.channel_id, d.message_id)
    if echo is None and FROM_SELF in d.tags:
        echo = True
    if echo is None and not forged:
        return processed
    kept = [t for t in d.tags if t != ECHO_TAG]
    if echo is None:
        return replace(processed, metadata=dict(processed.metadata, tags=kept))
    return replace(processed, metadata=dict(processed.metadata, tags=[*kept, ECHO_TAG], echoOf=echo), echo_of=echo)


class EchoMemory:
    """Ingest's echo port (mcplhost/ingest/ports.py) over the outbox repository's window of recent deliveries."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox

    async def seed(self, now_ms: int) -> int:
        return await self._outbox.load_recent_delivered(now_ms)

    def marked(self, processed: Processed) -> Processed:
        return marked(processed, self._outbox.recent_delivered)
