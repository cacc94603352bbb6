"""Every bound of peer messaging, in one place (docs/peers.md#guards-and-throttles).

Windows are sliding, in milliseconds of host wall-clock time (the same clock
the durable queue's `created_at` is written in, so a restart reloads them).
"""

from __future__ import annotations

#: Admitted sends from one sender to one target within PAIR_WINDOW_MS; the next is `rate_limited`.
PAIR_MAX = 5
PAIR_WINDOW_MS = 60_000
#: Admitted sends to one target from all senders within TARGET_WINDOW_MS; the next is `rate_limited`.
TARGET_MAX = 10
TARGET_WINDOW_MS = 60_000
#: The same (sender, target, trimmed text) admitted within this window: `refused`, reason `duplicate`.
DUPLICATE_WINDOW_MS = 120_000
#: Queued, undelivered peer messages one target may hold; past it `refused`, reason `queue_full`.
QUEUE_MAX = 10
#: Consecutive turns of a target started by agents (peer messages, or another agent's speech coming back
#: through a chat connector) before user or parent input; at it, peer sends are `refused`, reason
#: `needs_attention`, and such wakes are held.
CONSECUTIVE_WAKES_MAX = 3
#: The longest window: throttle entries older than this are evicted on every check.
LONGEST_WINDOW_MS = max(PAIR_WINDOW_MS, TARGET_WINDOW_MS, DUPLICATE_WINDOW_MS)
#: Longest message a peer may send, in characters; a longer one is refused (reason `too_long`), never cut.
MESSAGE_MAX_CHARS = 16_000
