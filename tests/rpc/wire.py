"""An in-memory wire for driving a `Session` from a test: the test plays the peer."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import anyio


class BytePipe:
    """One direction of a byte stream, with `send`/`receive` like anyio's byte streams."""

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._arrived = anyio.Event()
        self._closed = False

    async def send(self, data: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        self._chunks.append(data)
        self._arrived.set()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._chunks:
            if self._closed:
                raise anyio.EndOfStream
            self._arrived = anyio.Event()
            await self._arrived.wait()
        return self._chunks.popleft()

    def close(self) -> None:
        self._closed = True
        self._arrived.set()

    def queued(self) -> bytes:
        """What was sent and not yet received (nothing, once a stop has written everything it would)."""
        return b"".join(self._chunks)


class DeadPipe:
    """A peer's stdin that takes no write until `break_`, then fails every write, as a closed pipe does."""

    def __init__(self) -> None:
        self._broken = anyio.Event()

    async def send(self, data: bytes) -> None:
        await self._broken.wait()
        raise anyio.BrokenResourceError

    def break_(self) -> None:
        self._broken.set()


class Peer:
    """The test's end: write what the peer would send, read what the session wrote."""

    def __init__(self) -> None:
        self.to_session = BytePipe()
        self.from_session = BytePipe()
        self._buffer = b""

    async def write(self, message: Any) -> None:
        if isinstance(message, bytes):
            await self.to_session.send(message)
        else:
            await self.to_session.send(json.dumps(message).encode() + b"\n")

    async def read(self, timeout: float = 5.0) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            while b"\n" not in self._buffer:
                self._buffer += await self.from_session.receive()
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def pending_bytes(self) -> bytes:
        return self._buffer

    def close(self) -> None:
        self.to_session.close()
