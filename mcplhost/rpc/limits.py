"""Every bound the rpc layer puts on one connector's wire, defined once (docs/connectors.md §15).

The layers above import these; docs/connectors.md §15 lists them all,
with the ones the protocol layer adds (channels, inference).
"""

from __future__ import annotations

import msgspec

#: 16 MiB. Content blocks carry base64 images and audio, so a line of several
#: MiB is normal (asyncio's 64 KiB default is the classic trap); the cap only
#: exists so a connector that never sends a newline cannot exhaust memory.
#: It bounds the lines the host writes too (a reader with the same cap would
#: drop a longer one): such a message is never written (rpc/session.py).
MAX_LINE_BYTES = 16 * 1024 * 1024
#: Arrays and objects nested deeper than this refuse the whole line (-32700).
#: Real messages nest under 10 levels; the decoder and everything that walks a
#: decoded value would otherwise recurse as deep as the peer likes.
MAX_NESTING_DEPTH = 64
#: Requests from one peer whose work runs at once; as many again may wait queued.
MAX_CONCURRENT_REQUESTS = 256
#: Bytes (as received) of the peer's lines held at once: requests queued or
#: running, and the notification being handled. Past it the reader stops
#: reading, so the pipe pushes back on the peer; it is 4 full-size lines.
MAX_PENDING_BYTES = 4 * MAX_LINE_BYTES
#: Outgoing lines waiting for the writer before senders wait too.
MAX_QUEUED_LINES = 4096
#: Bytes of outgoing lines waiting for the writer before senders wait too
#: (answers to a peer that does not read them must not pile up).
MAX_OUTGOING_BYTES = 4 * MAX_LINE_BYTES
#: One write to the peer that does not complete within this breaks the
#: connection: a peer that stops reading its stdin must not hold answers,
#: requests and a stop forever, and a line cut in the middle cannot be resumed.
WRITE_STALL_S = 30.0
#: Read size from the pipe.
READ_CHUNK = 65536
#: How long a request of ours waits for its answer unless the caller says otherwise.
DEFAULT_TIMEOUT_S = 10.0


class SessionLimits(msgspec.Struct, frozen=True, kw_only=True):
    """One session's bounds (rpc/session.py), each defaulting to the constant above that names it."""

    max_line_bytes: int = MAX_LINE_BYTES  # both ways: a longer line of ours is never written
    max_concurrent: int = MAX_CONCURRENT_REQUESTS  # deferred work at once; as many again queued
    max_pending_bytes: int = MAX_PENDING_BYTES  # the peer's lines held at once before reading waits
    max_outgoing_bytes: int = MAX_OUTGOING_BYTES  # our lines waiting for the writer before senders wait
    timeout: float = DEFAULT_TIMEOUT_S  # a request of ours, unless its caller gives another
    write_stall_s: float = WRITE_STALL_S  # one write that does not complete within it breaks the connection


DEFAULT_LIMITS = SessionLimits()
