"""Group commits: many small writes share one transaction, each acknowledged after it.

Connectors often send one message per request, and several connectors write
at once; a commit per request would cap the host at the disk's commit rate,
and a round trip to SQLite's thread per request at the thread-hop rate.
`GroupWriter` takes every write that is queued, applies all their typed
operations (store/operations.py), each type with one repository call,
commits once, and only then wakes each caller with its operations' results
(the ids committed, or the originals of repeats), each typed as its
operation declares:

    turn_id = await writer.write(BeginTurn("scout", (17,), now))          # one operation: its result
    committed = await writer.submit(publish, FinishTurn(...), SetCursor(...))  # several, together
    committed[publish].outbox_ids                                          # each one's result, by operation

A write is a tuple of operations that commit together or not at all. If the
group's transaction fails, every write in it gets the error (nothing of it
is stored, nothing was acknowledged), and the failure is logged once.

On shutdown the writer commits everything already queued (bounded by
`DRAIN_S`) before it ends, so work that reached it is never dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import structlog
from anyio.abc import TaskStatus

from .interfaces import Repositories
from .items import ItemRow, ItemWritten, NewItem
from .operations import ClaimPush, InsertItems, Operation, PushWritten
from .pushes import PushClaim

log = structlog.get_logger()

R = TypeVar("R")

#: Writes queued before callers wait (back-pressure to the connectors).
MAX_QUEUED_WRITES = 4096
#: Writes committed together at most.
MAX_GROUP = 1024
#: On shutdown, how long the writer may take to commit what is queued.
DRAIN_S = 10.0


class _Write:
    __slots__ = ("operations", "done", "results", "error")

    def __init__(self, operations: tuple[Operation[Any], ...]) -> None:
        self.operations = operations
        self.done = False
        self.results: list[Any] = []
        self.error: BaseException | None = None


class Committed:
    """What one write's operations came to: `committed[operation]` is the result that operation declares.

    Not a sequence: a result is found by its operation, never by position.
    """

    __iter__ = None  # `for r in committed` and `(a,) = committed` fail at once, not at a KeyError for 0

    def __init__(self, operations: tuple[Operation[Any], ...], results: list[Any]) -> None:
        # By identity: the operations are held here, so no other object can take one's id while this lives.
        self._operations = operations
        self._results = {id(operation): result for operation, result in zip(operations, results, strict=True)}

    def __getitem__(self, operation: Operation[R]) -> R:
        """The result of `operation`, one of this write's (KeyError for any other)."""
        result: R = self._results[id(operation)]
        return result


class Queued:
    """A write queued by `GroupWriter.queue`: `await committed()` returns its `Committed` (or raises its error)."""

    __slots__ = ("_writer", "_write")

    def __init__(self, writer: GroupWriter, write: _Write) -> None:
        self._writer, self._write = writer, write

    async def committed(self) -> Committed:
        write = self._write
        while not write.done:
            await self._writer._committed.wait()
        if write.error is not None:
            raise write.error
        return Committed(write.operations, write.results)


class GroupWriter:
    """`on_commit(seconds)`: told how long each group's transaction took (the metrics' commit histogram)."""

    def __init__(self, store: Repositories, *, on_commit: Callable[[float], None] | None = None) -> None:
        self.store = store
        self._on_commit = on_commit
        self._send, self._receive = anyio.create_memory_object_stream[_Write](MAX_QUEUED_WRITES)
        # One event per commit, not per write: every waiter wakes on the commit
        # after it was queued and checks whether its own write was in it.
        self._committed = anyio.Event()
        self.stats = {"writes": 0, "operations": 0, "commits": 0, "failed": 0}

    async def write(self, operation: Operation[R]) -> R:
        """Commit one operation; return once committed, with its result."""
        return (await self.submit(operation))[operation]

    async def submit(self, *operations: Operation[Any]) -> Committed:
        """Commit `operations` together (each once); return once committed, with each one's result."""
        return await (await self.queue(*operations)).committed()

    async def queue(self, *operations: Operation[Any]) -> Queued:
        """Queue `operations` to commit together (each once), waiting only while the queue is full; the
        caller goes on with other work and awaits `committed()` when it needs the results.

        A queued write commits whatever its caller does next: like `submit` cancelled while it waits.
        """
        if len({id(operation) for operation in operations}) != len(operations):
            raise ValueError("an operation is submitted once per write: build another for a second one")
        write = _Write(operations)
        try:
            self._send.send_nowait(write)  # no yield to the loop while there is room
        except anyio.WouldBlock:
            await self._send.send(write)
        return Queued(self, write)

    async def store_items(self, items: list[NewItem], *, charged_to: str | None = None,
                          body_bytes: list[int] | None = None, rows: list[ItemRow] | None = None,
                          searched: object = None) -> list[ItemWritten]:
        """Store `items`; return once they are committed, with what each came to.

        `charged_to`, `body_bytes`: count them in that connector's quota; `rows`, `searched`: their rows
        built and searched for secrets already (store/operations.py `InsertItems`).
        """
        return await self.write(InsertItems(items, charged_to, body_bytes, rows, searched))

    async def store_push(self, claim: PushClaim, item: NewItem, *, body_bytes: int | None = None) -> PushWritten:
        """Store a push's item and answer once per (server, event id); a repeat gets the original's.

        `body_bytes`: count it in its connector's quota when stored (store/operations.py `ClaimPush`).
        """
        return await self.write(ClaimPush(claim, item, body_bytes))

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

    def close(self) -> None:
        """Close the queue of a writer that will not run (`run` closes it itself when it ends); idempotent."""
        self._send.close()
        self._receive.close()

    def _gather(self, first: _Write) -> list[_Write]:
        group = [first]
        while len(group) < MAX_GROUP:
            try:
                group.append(self._receive.receive_nowait())
            except anyio.WouldBlock:
                break
        return group

    async def _commit_group(self, group: list[_Write]) -> None:
        # Operations by type, in stage order and then first appearance; each
        # remembers its (write, position) so its result goes back to its caller.
        by_type: dict[type[Operation[Any]], list[tuple[_Write, int, Operation[Any]]]] = {}
        for write in group:
            write.results = [None] * len(write.operations)
            for position, operation in enumerate(write.operations):
                by_type.setdefault(type(operation), []).append((write, position, operation))
        began = time.perf_counter()
        try:
            async with self.store.transaction():
                for kind in sorted(by_type, key=lambda k: k.STAGE):  # sorted() is stable
                    entries = by_type[kind]
                    results = await kind.apply_all(self.store, [operation for _, _, operation in entries])
                    for (write, position, _), result in zip(entries, results, strict=True):
                        write.results[position] = result
        except Exception as exc:  # the group's transaction failed: none of it is stored
            log.error("store.group_failed", writes=len(group), exc_info=True)
            self.stats["failed"] += len(group)
            for write in group:
                write.error = exc
        else:
            self.stats["operations"] += sum(len(entries) for entries in by_type.values())
            if self._on_commit is not None:
                self._on_commit(time.perf_counter() - began)
        self.stats["writes"] += len(group)
        self.stats["commits"] += 1
        for write in group:
            write.done = True
        committed, self._committed = self._committed, anyio.Event()
        committed.set()
