"""Group commits: many small writes share one transaction, each acknowledged after it.

Connectors often send one message per request, and several connectors write
at once; a commit per request would cap the host at the disk's commit rate,
and a round trip to SQLite's thread per request at the thread-hop rate.
`GroupWriter` takes every write that is queued, stores all their rows with
one `executemany`, records their push answers with another, commits once,
and only then wakes each caller.

Two kinds of write exist: plain rows (`store_items`) and a push event
(`store_push`), which is stored once per (connector, eventId): a repeat,
already committed or earlier in the same group, gets the first answer back
and stores nothing. If the group's transaction fails, every write in it
gets the error (nothing of it is stored, nothing was acknowledged).

On shutdown the writer commits everything already queued (bounded by
`DRAIN_S`) before it ends, so work that reached it is never dropped.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus

from .db import Store
from .items import NewItem

#: Writes queued before callers wait (back-pressure to the connectors).
MAX_QUEUED_WRITES = 4096
#: Writes committed together at most.
MAX_GROUP = 1024
#: On shutdown, how long the writer may take to commit what is queued.
DRAIN_S = 10.0

_encode = msgspec.json.encode
_decode = msgspec.json.decode


class _Write:
    __slots__ = ("items", "push", "done", "result", "error")

    def __init__(self, items: list[NewItem], push: tuple[str, str, dict[str, Any], int] | None) -> None:
        self.items = items
        self.push = push  # (server_id, event_id, answer, created_at)
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class GroupWriter:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._send, self._receive = anyio.create_memory_object_stream[_Write](MAX_QUEUED_WRITES)
        # One event per commit, not per write: every waiter wakes on the commit
        # after it was queued and checks whether its own write was in it.
        self._committed = anyio.Event()
        self.stats = {"writes": 0, "items": 0, "commits": 0, "failed": 0}

    async def store_items(self, items: list[NewItem]) -> None:
        """Store `items`; return once they are committed."""
        await self._wait(_Write(items, None))

    async def store_push(self, server_id: str, event_id: str, item: NewItem, answer: dict[str, Any],
                         created_at: int) -> tuple[dict[str, Any], bool]:
        """Store a push's item and answer once; return (the answer to give, whether it was stored now)."""
        return await self._wait(_Write([item], (server_id, event_id, answer, created_at)))

    async def _wait(self, write: _Write) -> Any:
        try:
            self._send.send_nowait(write)  # no yield to the loop while there is room
        except anyio.WouldBlock:
            await self._send.send(write)
        while not write.done:
            await self._committed.wait()
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
                leftover: list[_Write] = []
                while True:
                    try:
                        leftover.append(self._receive.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                        break
                for start in range(0, len(leftover), MAX_GROUP):
                    await self._commit_group(leftover[start : start + MAX_GROUP])

    def _gather(self, first: _Write) -> list[_Write]:
        group = [first]
        while len(group) < MAX_GROUP:
            try:
                group.append(self._receive.receive_nowait())
            except anyio.WouldBlock:
                break
        return group

    async def _commit_group(self, group: list[_Write]) -> None:
        store = self.store
        try:
            async with store.transaction():
                rows: list[NewItem] = []
                answers: list[tuple[str, str, bytes, int]] = []
                first_answer: dict[tuple[str, str], dict[str, Any]] = {}
                for write in group:
                    if write.push is None:
                        rows.extend(write.items)
                        continue
                    server_id, event_id, answer, created_at = write.push
                    key = (server_id, event_id)
                    earlier = first_answer.get(key)
                    if earlier is None:
                        stored = await store.pushes.get(server_id, event_id)
                        earlier = _decode(stored) if stored is not None else None
                    if earlier is not None:
                        write.result = (earlier, False)  # a repeat: the original answer, nothing stored
                        continue
                    first_answer[key] = answer
                    rows.extend(write.items)
                    answers.append((server_id, event_id, _encode(answer), created_at))
                    write.result = (answer, True)
                await store.items.insert_many_nocommit(rows)
                await store.pushes.record_many_nocommit(answers)
        except Exception as exc:  # the group's transaction failed: none of it is stored
            self.stats["failed"] += len(group)
            for write in group:
                write.error = exc
        else:
            self.stats["items"] += len(rows)
        self.stats["writes"] += len(group)
        self.stats["commits"] += 1
        for write in group:
            write.done = True
        committed, self._committed = self._committed, anyio.Event()
        committed.set()
