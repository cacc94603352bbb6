"""The lines a session has queued for its writer task: many senders, one reader, bounded in lines.

What anyio's memory object stream gives the session, for the one shape it
uses, at a fraction of the cost per line (a session queues a line per answer,
and a busy connector is answered tens of thousands of times a second): a
deque, an event to wake the writer when it waits, and one to wake senders
waiting for room.

- `offer` queues a line if it fits and the queue is open, and says whether it
  did (the hot path: no exception);
- `put_nowait` queues a line or raises `anyio.WouldBlock` (full),
  `anyio.ClosedResourceError` (no more lines may be queued: `close`) or
  `anyio.BrokenResourceError` (the writer is gone: `abandon`).
- `put` waits for room, then queues; it raises the same two errors.
- `take` waits for lines and returns every line queued, oldest first; an
  empty list once `close` was called and all were taken.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

import anyio

T = TypeVar("T")


class OutgoingLines(Generic[T]):
    def __init__(self, max_lines: int) -> None:
        self._lines: deque[T] = deque()
        self._max_lines = max_lines
        self._closed = False
        self._abandoned = False
        self._readable: anyio.Event | None = None  # set when the reader waits
        self._room: anyio.Event | None = None  # set when a sender waits for room

    def __len__(self) -> int:
        return len(self._lines)

    def offer(self, line: T) -> bool:
        """Queue `line` if it fits now and the queue is open; False otherwise (then `put_nowait` says why)."""
        if self._closed or self._abandoned or len(self._lines) >= self._max_lines:
            return False
        self._lines.append(line)
        if self._readable is not None:
            self._readable.set()
            self._readable = None
        return True

    def put_nowait(self, line: T) -> None:
        if self._abandoned:
            raise anyio.BrokenResourceError
        if self._closed:
            raise anyio.ClosedResourceError
        if len(self._lines) >= self._max_lines:
            raise anyio.WouldBlock
        self._lines.append(line)
        if self._readable is not None:
            self._readable.set()
            self._readable = None

    async def put(self, line: T) -> None:
        while True:
            try:
                self.put_nowait(line)
                return
            except anyio.WouldBlock:
                if self._room is None:
                    self._room = anyio.Event()
                await self._room.wait()

    async def take(self) -> list[T]:
        """Every line queued (waiting for one); empty once closed and drained."""
        while not self._lines:
            if self._closed or self._abandoned:
                return []
            if self._readable is None:
                self._readable = anyio.Event()
            await self._readable.wait()
        lines = list(self._lines)
        self._lines.clear()
        self._wake_senders()
        return lines

    def close(self) -> None:
        """No more lines: `take` returns what is queued, then nothing."""
        self._closed = True
        self._wake_reader()
        self._wake_senders()

    def abandon(self) -> None:
        """The reader is gone: every sender, waiting or not, gets BrokenResourceError from now on."""
        self._abandoned = True
        self._lines.clear()
        self._wake_reader()
        self._wake_senders()

    def _wake_reader(self) -> None:
        if self._readable is not None:
            self._readable.set()
            self._readable = None

    def _wake_senders(self) -> None:
        if self._room is not None:
            self._room.set()
            self._room = None
