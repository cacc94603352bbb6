"""Quiet and deaf connectors, as rules on timestamps (docs/operations.md#quiet-and-deaf-connectors).

Pure: the handle and the life's watchers (watch.py) pass in the state and the
monotonic times, so every boundary here is tested without processes or clocks.

- quiet: serving (ready or mcp_only) and no inbound item admitted for longer
  than `expect_traffic_within_s` since the later of "began serving" and "last
  inbound item"; never quiet while not serving, nor without the setting;
- deaf: no answer to a ping within `ping_timeout_s`; an error answer is an
  answer, so only the silence counts.
"""

from __future__ import annotations

from mcplhost.protocol.ports import SERVING, State

#: The MCP method the host pings with (MCP spec, "Ping"); its result is `{}`.
PING_METHOD = "ping"


def quiet_at(serving_since: float | None, last_inbound: float | None, expect: float | None) -> float | None:
    """The monotonic time after which a serving connector is quiet; None when it cannot become quiet."""
    if serving_since is None or expect is None:
        return None
    heard = serving_since if last_inbound is None else max(serving_since, last_inbound)
    return heard + expect


def is_quiet(state: State, serving_since: float | None, last_inbound: float | None, now: float,
             expect: float | None) -> bool:
    """Whether the connector is quiet at `now` (all times monotonic seconds; `expect` None: never)."""
    if state not in SERVING:
        return False
    deadline = quiet_at(serving_since, last_inbound, expect)
    return deadline is not None and now > deadline


def deaf_error(timeout_s: float) -> str:
    """The `last_error` of a life ended for not answering a ping."""
    return f"deaf: no answer to {PING_METHOD} within {timeout_s:g} s"
