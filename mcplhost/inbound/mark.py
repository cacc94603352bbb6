"""Marking header-shaped text in a sender's own words.

docs/provenance.md §4. Anyone who can post could type a line that looks like the
host's `[source: …]` header. So every *opening* in an item's text blocks gets
one backslash directly before its `[`, wherever it stands and whether or not
a backslash is already there. The host's own header block is added after
marking and is never marked.

The text blocks are read as one string (non-text blocks skipped, texts joined
with nothing between), so an opening split across blocks or around an image
is found; the backslash goes into the block holding the `[`.

Linear time, without a match object per opening (100,000 of them cost more
than the scan itself). An opening holds exactly one `[`, its first character.
So an opening whose `[` lies in a block either ends inside that block, and
one C-level substitution over the block marks it, or runs past the block's
end, and then its `[` is the block's last one; only that one needs a look at
the joined text. Each character is read by a bounded number of scans: its
block's substitution, and at most two checks started at the last `[` before
it, which stop at the next `[`.
"""

from __future__ import annotations

from typing import Any

from mcplhost.inbound.patterns import fast_opening_re

__all__ = ["MARK", "mark_openings"]

MARK = "\\"
# re.sub template for "the matched `[`, with MARK before it".
_MARKED_BRACKET_TEMPLATE = r"\\["


def mark_openings(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """New blocks with a backslash before every opening; `blocks` is untouched.

    Every block comes back as a new dict (nested values are shared, never
    changed). A block whose `type` is `"text"` must have a string `text`.
    """
    marked = [dict(block) for block in blocks]
    for block in marked:
        if block.get("type") == "text" and "[" in block["text"]:
            break
    else:
        return marked  # nothing to mark, the usual case: no `[` in any text
    text_blocks = [block for block in marked if block.get("type") == "text"]
    texts = [block["text"] for block in text_blocks]
    joined = "".join(texts)
    block_start = 0
    for index, (block, text) in enumerate(zip(text_blocks, texts)):
        if "[" in text:
            is_last = index == len(texts) - 1
            block["text"] = _marked_block(text, joined, block_start, is_last)
        block_start += len(text)
    return marked


def _marked_block(text: str, joined: str, block_start: int, is_last: bool) -> str:
    """`text` (at `block_start` in `joined`) with the openings whose `[` it holds marked."""
    opening = fast_opening_re()
    # sub() costs microseconds even with nothing to replace, and most blocks
    # holding a `[` hold no opening.
    marked = opening.sub(_MARKED_BRACKET_TEMPLATE, text) if opening.search(text) else text
    last = text.rfind("[")
    runs_on = (
        not is_last
        and opening.match(text, last) is None
        and opening.match(joined, block_start + last) is not None
    )
    if runs_on:
        at = last + len(marked) - len(text)  # shifted by the marks before it
        marked = marked[:at] + MARK + marked[at:]
    return marked
