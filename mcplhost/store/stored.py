"""What the layers above learn of a committed item, and the clock rows are stamped with.

`Stored(id, item)` is the event ingest offers for each item it stored
(mcplhost/ingest/events.py) and peer messaging builds for a message it
delivered (mcplhost/peers/service.py): defined here, below both, so neither
imports the other. `now_ms` is the host's time as every row's `created_at`
holds it: epoch milliseconds.
"""

from __future__ import annotations

import time

import msgspec

from mcplhost.store.items import NewItem

__all__ = ["Stored", "now_ms"]


class Stored(msgspec.Struct, frozen=True):
    """An item just committed: its id and the item, with its conversation and thread ids.

    `missed_before` > 0: that many events just before this one were dropped
    because the consumer was behind; catch up from the store. Each request's
    events come in id order; events of concurrent requests may interleave.
    """

    id: int
    item: NewItem
    missed_before: int = 0


def now_ms() -> int:
    """Epoch milliseconds now."""
    return int(time.time() * 1000)
