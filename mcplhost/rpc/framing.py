"""Line framing for JSON-RPC over stdio, with no I/O.

One message is one line of UTF-8 JSON ended by ``\\n`` (MCP's stdio transport).
`LineBuffer.feed` takes whatever bytes arrived and returns the complete lines
they finish, already cleaned the lenient way: a trailing ``\\r`` stripped and
blank lines skipped. A line longer than the cap is never held in memory: the
buffer switches to discarding until the next newline and reports it once as
`Oversized`, so the connection survives and the caller can log why.
"""

from __future__ import annotations

from dataclasses import dataclass

from .limits import MAX_LINE_BYTES

_WHITESPACE = b" \t\r\n\f\v"


@dataclass(frozen=True, slots=True)
class Oversized:
    """A line longer than the cap was dropped; `size` is its length in bytes."""

    size: int
    limit: int


class LineBuffer:
    """Split a byte stream into lines, remembering where it already looked.

    Each byte is scanned for a newline once, so a long line that arrives in
    many small chunks costs time in proportion to its length.
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._partial = bytearray()
        self._discarding: int | None = None  # bytes dropped so far of an oversized line

    @property
    def held_bytes(self) -> int:
        """Bytes of an unfinished line held now: never more than `max_line_bytes` (a longer line is discarded)."""
        return len(self._partial)

    def feed(self, data: bytes) -> list[bytes | Oversized]:
        """Add `data`; return the lines (and oversize reports) it completes, in order."""
        out: list[bytes | Oversized] = []
        if self._discarding is not None:
            newline = data.find(b"\n")
            if newline < 0:
                self._discarding += len(data)
                return out
            out.append(Oversized(self._discarding + newline, self.max_line_bytes))
            self._discarding = None
            data = data[newline + 1 :]
        if b"\n" not in data:
            self._partial += data
            if len(self._partial) > self.max_line_bytes:
                self._discarding = len(self._partial)
                self._partial = bytearray()
            return out
        if self._partial:
            self._partial += data
            pieces = bytes(self._partial).split(b"\n")
        else:
            pieces = data.split(b"\n")
        rest = pieces.pop()
        limit = self.max_line_bytes
        for piece in pieces:
            if len(piece) > limit:
                out.append(Oversized(len(piece), limit))
            elif piece.strip(_WHITESPACE):
                out.append(piece[:-1] if piece.endswith(b"\r") else piece)
        if len(rest) > limit:
            self._discarding = len(rest)
            self._partial = bytearray()
        else:
            self._partial = bytearray(rest)
        return out

    def close(self) -> list[bytes | Oversized]:
        """End of input: a final line without a newline still counts."""
        out: list[bytes | Oversized] = []
        if self._discarding is not None:
            out.append(Oversized(self._discarding, self.max_line_bytes))
        elif self._partial.strip(_WHITESPACE):
            line = bytes(self._partial)
            out.append(line[:-1] if line.endswith(b"\r") else line)
        self._partial = bytearray()
        self._discarding = None
        return out
