"""Ingest: admitted items → the inbound pipeline → one commit → `Stored` events (mcplhost/ingest/service.py).

Echo knowledge comes in through `EchoPort` (mcplhost/ingest/ports.py); ingest imports nothing above it.
`Stored` and `now_ms` are the store's (mcplhost/store/stored.py), named here too for ingest's callers.
"""

from mcplhost.store import Stored, now_ms

from .events import STORED_EVENTS_BUFFER, stored_event_stream
from .ports import EchoPort
from .service import Ingest

__all__ = ["STORED_EVENTS_BUFFER", "EchoPort", "Ingest", "Stored", "now_ms", "stored_event_stream"]
