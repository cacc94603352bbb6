"""Conversation ids: one opaque, stable id per channel, or per thread in it.

Pure and shared: ingest stamps it on every stored item, the wake rules and
context rows group by it, and the speech router answers into it
(docs/agents.md#routing).
"""

from __future__ import annotations

import hashlib

import msgspec

from . import canonical_json


def conversation_id(server_id: str, channel_id: str | None, thread_id: str | None) -> str:
    """An opaque, stable id for one conversation: a channel, or a thread in it."""
    key = [server_id, channel_id, thread_id]
    try:
        data = msgspec.json.encode(key)
    except UnicodeEncodeError:  # a lone surrogate in an id
        data = canonical_json(key).encode()
    return "conv_" + hashlib.sha256(data).hexdigest()[:24]
