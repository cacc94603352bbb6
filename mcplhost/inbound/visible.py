"""Whether a payload shows anything at all (docs/provenance.md §3, admission).

A push whose payload has no visible content (no blocks, or text that is
empty once whitespace and invisible characters are set aside, and no media)
is refused at admission and never stored.
"""

from __future__ import annotations

from typing import Any

from mcplhost.inbound.patterns import VISIBLE_CHAR_RE

__all__ = ["MEDIA_BLOCK_TYPES", "has_visible_content"]

# A block of one of these types shows something whatever it holds.
MEDIA_BLOCK_TYPES = frozenset({"image", "audio", "resource"})


def has_visible_content(blocks: list[dict[str, Any]]) -> bool:
    """True when some block is media, or some text has a character that is
    neither whitespace (docs/provenance.md#the-character-classes) nor invisible.

    Blocks of any other type show nothing.
    """
    for block in blocks:
        kind = block.get("type")
        if kind in MEDIA_BLOCK_TYPES:
            return True
        if kind == "text" and VISIBLE_CHAR_RE.search(block.get("text", "")) is not None:
            return True
    return False
