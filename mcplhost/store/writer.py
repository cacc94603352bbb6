"""Group commits: many small writes share one transaction, each acknowledged after it.

Connectors often send one message per request, and several connectors write
at once; a commit per request would cap the host at the disk's commit rate.
`GroupWriter` takes whatever writes are queued, runs each in its own
savepoint inside one transaction, commits once, and only then answers each
caller. A failing write rolls back its own savepoint and gets its own error;
the others still commit.

On shutdown the writer commits everything already queued (bounded by
`DRAIN_S`) before it ends, so work that reached it is never dropped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import anyio
from anyio.abc import TaskStatus

from .db import Store

T = TypeVar("T")

#: Writes queued before `submit` waits (back-pressure to the connectors).
MAX_QUEUED_WRITES = 4096
#: Writes committed together at most.
MAX_GROUP = 512
#: On shutdown, how long the writer may take to commit what is queued.
DRAIN_S = 10.0


class _Write(Generic[T]):
    __slots__ = ("work", "done", "result", "error")

    def __init__(self, work: Callable[[Store], Awaitable[T]]) -> None:
        self.work = work
        self.done = anyio.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class GroupWriter:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._send, self._receive = anyio.create_memory_object_stream[_Write[Any]](MAX_QUEUED_WRITES)
        self.stats = {"writes": 0, "commits": 0, "failed": 0}

    async def submit(self, work: Callable[[Store], Awaitable[T]]) -> T:
        """Run `work(store)` inside a group transaction; return once it is committed."""
        write: _Write[T] = _Write(work)
        await self._send.send(write)
        await write.done.wait()
        if write.error is not None:
            raise write.error
        return write.result

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            async with self._receive:
                async for first in self._receive:
                    with anyio.CancelScope(shield=True):  # a group once taken is always finished
                        await self._commit_group(self._gather(first))
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(DRAIN_S):
                self._send.close()
                leftover: list[_Write[Any]] = []
                while True:
                    try:
                        leftover.append(self._receive.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                        break
                for start in range(0, len(leftover), MAX_GROUP):
                    await self._commit_group(leftover[start : start + MAX_GROUP])

    def _gather(self, first: _Write[Any]) -> list[_Write[Any]]:
        group = [first]
        while len(group) < MAX_GROUP:
            try:
                group.append(self._receive.receive_nowait())
            except anyio.WouldBlock:
                break
        return group

    async def _commit_group(self, group: list[_Write[Any]]) -> None:
        if not group:
            return
        try:
            async with self.store.transaction():
                for write in group:
                    try:
                        async with self.store.savepoint():
                            write.result = await write.work(self.store)
                    except Exception as exc:  # this write's own failure; the others go on
                        write.error = exc
                        self.stats["failed"] += 1
        except Exception as exc:  # the commit itself failed: nobody's write is stored
            for write in group:
                write.error = exc
        self.stats["writes"] += len(group)
        self.stats["commits"] += 1
        for write in group:
            write.done.set()
