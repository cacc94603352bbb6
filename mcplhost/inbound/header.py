"""The stored source header: one line naming where an item came from.

docs/provenance.md §3. The header is rendered once, at acceptance, from the frozen
source envelope (`metadata.source`), and stored as the item's own first text
block. Grammar::

    [source: S / C · L · thread T · reply to R]     channel item
    [source: S · unscoped]                          push that names no channel
"""

from __future__ import annotations

from typing import Any

from mcplhost.inbound.quoting import header_value, label_value

__all__ = ["SEPARATOR", "render_source_header"]

# "The separator is ` · ` (U+00B7 with one space each side)."
SEPARATOR = " \u00b7 "


def render_source_header(source: dict[str, Any]) -> str | None:
    """The header line for a frozen source envelope; None for a `surface` item.

    The label, thread and reply parts appear only when the envelope has them.
    An empty string counts as none for all three (docs/provenance.md says so of the
    label; a part reading `thread ` with nothing after it would name nothing).
    An `unscoped` header is `[source: S · unscoped]` whatever else the
    envelope holds: the grammar gives it no other part.
    """
    kind = source["kind"]
    if kind == "surface":
        return None
    server = header_value(source["serverId"])
    if kind == "unscoped":
        return f"[source: {server}{SEPARATOR}unscoped]"
    if kind != "channel":
        raise ValueError(f"unknown source kind {kind!r}")

    parts = [f"{server} / {header_value(source['channelId'])}"]
    if label := source.get("label"):
        parts.append(label_value(label))
    if thread := source.get("threadId"):
        parts.append(f"thread {header_value(thread)}")
    if reply_to := source.get("replyTo"):
        parts.append(f"reply to {header_value(reply_to)}")
    return f"[source: {SEPARATOR.join(parts)}]"
