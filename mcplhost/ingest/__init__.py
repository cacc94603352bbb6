"""Ingest: admitted items → the inbound pipeline → one commit → `Stored` events (mcplhost/ingest/service.py).

Echo knowledge comes in through `EchoPort` (mcplhost/ingest/ports.py); ingest imports nothing above it.
"""

from .ports import EchoPort
from .service import STORED_EVENTS_BUFFER, Ingest, Stored, now_ms, stored_event_stream

__all__ = ["STORED_EVENTS_BUFFER", "EchoPort", "Ingest", "Stored", "now_ms", "stored_event_stream"]
