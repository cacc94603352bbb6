"""Telling the layers above what a commit stored: `on_stored`, and the `Stored` events stream.

After each commit, every newly stored item goes to `on_stored` (e.g. `mcplhost
dev`'s live view, the console's feed) and is offered as a `Stored(id, item)`
on the `events` stream Host hands in (none: no events). The policy when the
consumer falls behind is drop-and-flag, not back-pressure: a connector's
answer waits only for its commit, never for an agent (docs/agents.md#scheduling:
nothing blocks inbound storage). A dropped event is never silent: it is
counted (`statistics()`), logged once per overflow, and the next event
delivered carries `missed_before`, the number dropped just before it, so the
consumer knows to catch up from its durable cursor (all items after its last
handled id are in the store).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from mcplhost.store import ItemWritten, NewItem, Stored

#: Stored events buffered for a slow consumer before further ones are dropped (and flagged).
STORED_EVENTS_BUFFER = 4096

__all__ = ["STORED_EVENTS_BUFFER", "StoredEmitter", "stored_event_stream"]


def stored_event_stream() -> tuple[MemoryObjectSendStream[Stored], MemoryObjectReceiveStream[Stored]]:
    """A new stream of `Stored` events, bounded by STORED_EVENTS_BUFFER: Ingest sends, one consumer receives."""
    return anyio.create_memory_object_stream[Stored](STORED_EVENTS_BUFFER)


class StoredEmitter:
    """The one owner of the events stream, its drop count and `on_stored`."""

    def __init__(self, log: Any, *, events: MemoryObjectSendStream[Stored] | None = None,
                 on_stored: Callable[[list[NewItem]], None] | None = None) -> None:
        self.log = log
        self.on_stored = on_stored
        self.events = events  # bounded (STORED_EVENTS_BUFFER); see the module docstring
        self._missed = 0  # events dropped since the last one delivered
        self.offered = 0
        self.dropped = 0

    def emit(self, items: list[NewItem], written: list[ItemWritten]) -> None:
        """After a commit: tell `on_stored` and the events stream about the items new in it."""
        new = [(w.id, item) for item, w in zip(items, written, strict=True) if not w.duplicate]
        if self.on_stored is not None and new:
            self.on_stored([item for _, item in new])
        if self.events is None:
            return
        for item_id, item in new:
            try:
                self.events.send_nowait(Stored(item_id, item, self._missed))
            except anyio.WouldBlock:
                if self._missed == 0:
                    self.log.warning("ingest.stored_events_dropped", buffer=STORED_EVENTS_BUFFER, first_id=item_id)
                self._missed += 1
                self.dropped += 1
                continue
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.log.info("ingest.stored_events_closed")  # the consumer is gone: no more events
                self.events = None
                return
            if self._missed:
                self.log.info("ingest.stored_events_resumed", missed=self._missed, id=item_id)
                self._missed = 0
            self.offered += 1
