"""A catch-up wake waits for its routes (docs/agents.md#catch-up).

After a restart the catch-up wakes are due at once, while the connectors
are still starting: a turn run then finds its item's channel not registered
yet, so its reply is routed `unknown` and kept as a draft. So before a
catch-up wake's turn, the runner waits until every connector its items came
through has registered their channels again (`CatchUpPort.wait_channel`),
or has given up (stopped, in the slow lane, plain MCP only), at most
CATCH_UP_ROUTE_WAIT_S. Live wakes never wait: their items came through a
connector that was serving. An item of no channel (an unscoped push) has no
route to wait for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anyio

from mcplhost.protocol.ports import CatchUpPort
from mcplhost.store import StoredItem
from mcplhost.store.rows import ChannelSource

#: How long a catch-up wake waits for its connectors to register the channels of its items, at most.
CATCH_UP_ROUTE_WAIT_S = 30.0


def routes_of(items: Sequence[StoredItem]) -> list[tuple[str, str]]:
    """(connector, channel id) of each channel item, once each, in a stable order."""
    found = set()
    for item in items:
        meta = item.meta
        if isinstance(meta.source, ChannelSource) and meta.server_id is not None and meta.channel_id is not None:
            found.add((meta.server_id, meta.channel_id))
    return sorted(found)


async def wait_for_routes(handles: Mapping[str, CatchUpPort], items: Sequence[StoredItem], *,
                          timeout: float = CATCH_UP_ROUTE_WAIT_S) -> list[str]:
    """Wait until the items' channels are registered or their connectors gave up, at most `timeout` in all.

    Returns the routes still not registered (`connector/channel`), none when every one is: a connector that
    is not configured any more, or gave up, is among them at once.
    """
    routes = [(server, channel) for server, channel in routes_of(items) if server in handles]
    with anyio.move_on_after(timeout):
        for server, channel in routes:
            await handles[server].wait_channel(channel)
    missing = [f"{server}/{channel}" for server, channel in routes_of(items)
               if server not in handles or handles[server].channel(channel) is None]
    return missing
