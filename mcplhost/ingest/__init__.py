"""Ingest: admitted items → the inbound pipeline → one commit → `Stored` events (mcplhost/ingest/service.py)."""

from .service import STORED_EVENTS_BUFFER, Ingest, Stored, now_ms

__all__ = ["STORED_EVENTS_BUFFER", "Ingest", "Stored", "now_ms"]
