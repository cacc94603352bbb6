"""The life's liveness watchers: quiet spells and pings (docs/operations.md#quiet-and-deaf-connectors).

Both run in the life's task group once its handshake is over, so they end
with the life; the rules they apply are liveness.py's.

- `watch_quiet` logs `connector.quiet` once when a quiet spell begins and
  `connector.traffic_resumed` when an inbound item ends it. A spell belongs
  to one life: a life that ends while quiet ends its spell without a line
  (the state change is logged), and the next life starts afresh.
- `ping_until_deaf` sends MCP `ping` every `ping_interval_s`, one at a time:
  the next is due `ping_interval_s` after the previous was sent, and is sent
  only once that one is answered or has timed out, so pings never pile up.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec

from mcplhost.protocol.ports import SERVING, ConnectorGone, ConnectorNotReady
from mcplhost.rpc import RemoteError, RequestTimeout

from .handle import ConnectorHandle
from .liveness import PING_METHOD, deaf_error


async def watch_quiet(handle: ConnectorHandle, plog: Any) -> None:
    """Log each quiet spell of this life once as it begins, and its end; runs until the life's group is cancelled."""
    expect = handle.spec.expect_traffic_within_s
    spell_began: float | None = None  # monotonic
    while True:
        now = handle.monotonic()
        if handle.quiet(now):
            if spell_began is None:
                spell_began = now
                stats = handle.statistics()
                plog.warning("connector.quiet", expect_traffic_within_s=expect, last_inbound_at=stats.last_inbound_at,
                             detail=f"serving, but no inbound item for more than {expect:g} s")
        elif spell_began is not None:
            if handle.state in SERVING:  # not quiet while serving: an inbound item ended the spell
                plog.info("connector.traffic_resumed", quiet_s=round(now - spell_began, 3))
            spell_began = None
        deadline = handle.quiet_deadline()
        if spell_began is not None or deadline is None:
            await handle.wait_activity()  # only an item or a state change can change anything now
        else:
            # Not woken by each item while traffic flows: at the deadline, look again (an item may have moved it).
            await anyio.sleep(max(deadline - handle.monotonic(), 0.0))


async def ping_until_deaf(handle: ConnectorHandle, interval: float, timeout: float) -> str | None:
    """Ping while the life serves; the deaf error once a ping goes unanswered, None once the life stops serving."""
    due = anyio.current_time() + interval
    while True:
        await anyio.sleep(max(due - anyio.current_time(), 0.0))
        due = anyio.current_time() + interval
        try:
            # Raw: the answer is not read, only awaited; any result or error object means "alive".
            await handle.request(PING_METHOD, timeout=timeout, result_type=msgspec.Raw)
        except RemoteError:
            pass  # an error answer is an answer
        except RequestTimeout:
            return deaf_error(timeout)
        except (ConnectorNotReady, ConnectorGone):
            return None  # the life is ending on its own; its end says why
