"""Marking header-shaped text in a sender's own words.

docs/provenance.md §4 and §4a. Anyone who can post could type a line that
looks like the host's `[source: …]` header, in plain or look-alike characters
(`［ѕоurсе： x］`). So every *opening* in an item's text blocks gets one
backslash directly before its bracket (the character that reads as `[`),
wherever it stands and whether or not a backslash is already there. Nothing
else changes. The host's own header block is added after marking and is
never marked.

The text blocks are read as one string (non-text blocks skipped, texts joined
with nothing between), so an opening split across blocks or around an image
is found; the backslash goes into the block holding the `[`.

Linear time, without a match object per opening (100,000 of them cost more
than the scan itself). An opening holds exactly one bracket, its first
character (no bracket reads as anything else in an opening). So an opening
whose bracket lies in a block either ends inside that block, and one C-level
substitution over the block marks it, or runs past the block's end, and then
its bracket is the block's last one; only that one needs a look at the
joined text. Each character is read by a bounded number of scans: its
block's substitution, and at most two checks started at the last bracket
before it, which stop at the next bracket.
"""

from __future__ import annotations

from typing import Any

from mcplhost.inbound.lookalikes import forms
from mcplhost.inbound.patterns import fast_opening_re

__all__ = ["MARK", "compile_patterns", "has_opening", "mark_openings"]

MARK = "\\"
# The characters that read as `[`: a text holding none of them holds no opening.
_BRACKETS = forms("[")
# The ones an ASCII text can hold (`str.isascii` answers without reading the text).
_ASCII_BRACKETS = "".join(bracket for bracket in _BRACKETS if bracket.isascii())


def _brackets_in(text: str) -> str:
    """The characters reading as `[` that `text` holds, each found by a fast `in` scan."""
    if text.isascii():
        if _ASCII_BRACKETS == "[":  # the one ASCII bracket: no join for the usual text (every inbound block)
            return "[" if "[" in text else ""
        brackets = _ASCII_BRACKETS
    else:
        brackets = _BRACKETS
    return "".join(bracket for bracket in brackets if bracket in text)


def compile_patterns() -> None:
    """Derive and compile the marking patterns now (about 0.2 s), so the first message does not wait for them."""
    for bracket in (None, *_BRACKETS):
        fast_opening_re(bracket)


def has_opening(text: str) -> bool:
    """Whether `text` holds an opening; no pattern runs over a text without a bracket."""
    return any(fast_opening_re(bracket).search(text) for bracket in _brackets_in(text))


def mark_openings(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """New blocks with a backslash before every opening; `blocks` is untouched.

    Every block comes back as a new dict (nested values are shared, never
    changed). A block whose `type` is `"text"` must have a string `text`.
    """
    marked = [dict(block) for block in blocks]
    for block in marked:
        if block.get("type") == "text" and _brackets_in(block["text"]):
            break
    else:
        return marked  # nothing to mark, the usual case: nothing reading as `[` in any text
    text_blocks = [block for block in marked if block.get("type") == "text"]
    texts = [block["text"] for block in text_blocks]
    joined = "".join(texts)
    block_start = 0
    last_index = len(texts) - 1
    for index, (block, text) in enumerate(zip(text_blocks, texts)):
        brackets = _brackets_in(text)
        if brackets:
            block["text"] = _marked_block(text, brackets, joined, block_start, index == last_index)
        block_start += len(text)
    return marked


def _marked_block(text: str, brackets: str, joined: str, block_start: int, is_last: bool) -> str:
    """`text` (at `block_start` in `joined`, holding `brackets`) with the openings whose bracket it holds marked."""
    marked = text
    for bracket in brackets:
        # One pattern per bracket, so each begins with a literal (a fast scan) and its template is literal too
        # (one with a group reference costs a Python call per match). sub() costs microseconds even with
        # nothing to replace, and most blocks holding a bracket hold no opening.
        opening = fast_opening_re(bracket)
        if opening.search(marked):
            marked = opening.sub(MARK + MARK + bracket, marked)  # a template: MARK escaped, then the bracket
    if is_last:
        return marked
    opening = fast_opening_re()
    last = max(map(text.rfind, brackets))
    if opening.match(text, last) is None and opening.match(joined, block_start + last) is not None:
        at = last + len(marked) - len(text)  # shifted by the marks before it
        marked = marked[:at] + MARK + marked[at:]
    return marked
