"""The stored source header: one line naming where an item came from.

docs/provenance.md §3. The header is rendered once, at acceptance, from the frozen
source envelope (`metadata.source`), and stored as the item's own first text
block. Grammar::

    [source: S / C · L · thread T · reply to R]     channel item
    [source: S · unscoped]                          push that names no channel
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import msgspec

from mcplhost.inbound.quoting import (
    CACHED_VALUE_CHARS,
    CACHED_VALUES,
    forget_quoted_values,
    header_value,
    label_value,
)

__all__ = ["SEPARATOR", "render_source_header", "source_header"]

# "The separator is ` · ` (U+00B7 with one space each side)."
SEPARATOR = " \u00b7 "


class _Envelope(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The members of a frozen source envelope (inbound/source.py) the header names."""

    kind: str
    server_id: str
    channel_id: str | None = None
    label: str | None = None
    thread_id: str | None = None
    reply_to: str | None = None


def render_source_header(source: dict[str, Any]) -> str | None:
    """The header line for a frozen source envelope (`metadata.source`); None for a `surface` item."""
    e = msgspec.convert(source, _Envelope)
    return source_header(e.kind, e.server_id, e.channel_id, e.label, e.thread_id, e.reply_to)


def source_header(kind: str, server_id: str, channel_id: str | None, label: str | None, thread_id: str | None,
                  reply_to: str | None) -> str | None:
    """The header line for the envelope these values are frozen into; None for a `surface` item.

    The label, thread and reply parts appear only when the envelope has them.
    An empty string counts as none for all three (docs/provenance.md says so of the
    label; a part reading `thread ` with nothing after it would name nothing).
    An `unscoped` header is `[source: S · unscoped]` whatever else the
    envelope holds: the grammar gives it no other part.
    """
    if kind == "surface":
        return None
    if kind == "unscoped":
        return f"[source: {header_value(server_id)}{SEPARATOR}unscoped]"
    if kind != "channel":
        raise ValueError(f"unknown source kind {kind!r}")
    if channel_id is None:
        raise ValueError("a channel envelope names its channel")

    head = _place(server_id, channel_id, label)
    if not thread_id and not reply_to:
        return head + "]"
    parts = [head]
    if thread_id:
        parts.append(f"thread {header_value(thread_id)}")
    if reply_to:
        parts.append(f"reply to {header_value(reply_to)}")
    return SEPARATOR.join(parts) + "]"


def _place(server_id: str, channel_id: str, label: str | None) -> str:
    """`[source: S / C · L`: the part every item of one channel shares (remembered when short)."""
    if len(server_id) + len(channel_id) + len(label or "") <= CACHED_PLACE_CHARS:
        return _place_cached(server_id, channel_id, label)
    return _render_place(server_id, channel_id, label)


def _render_place(server_id: str, channel_id: str, label: str | None) -> str:
    place = f"[source: {header_value(server_id)} / {header_value(channel_id)}"
    return f"{place}{SEPARATOR}{label_value(label)}" if label else place


#: A channel's place part is remembered when its three values add up to at most this many characters.
CACHED_PLACE_CHARS = 3 * CACHED_VALUE_CHARS
_place_cached = lru_cache(maxsize=CACHED_VALUES)(_render_place)


def forget_rendered() -> None:
    """Empty the remembered places and quoted values, so the next render pays a first sight (tests/bench)."""
    _place_cached.cache_clear()
    forget_quoted_values()
