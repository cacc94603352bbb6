"""Tests for mcplhost/store/writer.py: typed operations grouped into one commit, results back to each caller."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import msgspec
import pytest
from structlog.testing import capture_logs

from mcplhost.store import PushClaim, Store
from mcplhost.store.interfaces import Repositories
from mcplhost.store.operations import InsertItems
from mcplhost.store.writer import GroupWriter

from .conftest import make_item, submitted


def keyed(text: str, message: str = "m-1") -> Any:
    item = make_item(text)
    return msgspec.structs.replace(item, metadata={**item.metadata, "messageId": message}, dedup_digest="d" * 64)


class CountRows(msgspec.Struct, frozen=True):
    """A later-stage operation: reports how many rows exist when it runs."""

    STAGE: ClassVar[int] = 20

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[CountRows]) -> list[int]:
        count = len(await repos.items.list())
        return [count for _ in ops]


class Explode(msgspec.Struct, frozen=True):
    """An operation whose repository call fails."""

    STAGE: ClassVar[int] = 20

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[Explode]) -> list[None]:
        raise RuntimeError("disk on fire")


@asynccontextmanager
async def running(store: Store) -> AsyncIterator[GroupWriter]:
    """A GroupWriter running on `store` for the block (a context manager: fixtures run in another task)."""
    group = GroupWriter(store)
    async with anyio.create_task_group() as tg:
        await tg.start(group.run)
        yield group
        tg.cancel_scope.cancel()


async def together(*calls: Any) -> list[Any]:
    """Run the calls concurrently (so they land in one group) and return their results in order."""
    results: list[Any] = [None] * len(calls)

    async def one(index: int) -> None:
        results[index] = await calls[index]()

    async with anyio.create_task_group() as tg:
        for index in range(len(calls)):
            tg.start_soon(one, index)
    return results


class TestGroupWriter:
    async def test_each_caller_gets_its_own_results_after_one_commit(self, store: Store):
        """Concurrent writes share a commit; each gets the ids of its own items, in order."""
        async with running(store) as writer:
            first, second = await together(lambda: writer.store_items([make_item("a"), make_item("b")]),
                                            lambda: writer.store_items([make_item("c")]))
            stored = {item.content[0]["text"]: item.id for item in await store.items.list()}
            assert [w.id for w in first] == [stored["a"], stored["b"]] and [w.id for w in second] == [stored["c"]]
            assert writer.stats["commits"] == 1 and writer.stats["writes"] == 2

    async def test_a_redelivery_in_the_same_group_is_stored_once(self, store: Store):
        """The same channel item from two writes of one group: one row, both answered with its id."""
        async with running(store) as writer:
            first, second = await together(lambda: writer.store_items([keyed("x")]),
                                            lambda: writer.store_items([keyed("x")]))
            assert first[0].id == second[0].id and [first[0].duplicate, second[0].duplicate] == [False, True]
            assert len(await store.items.list()) == 1

    async def test_a_repeated_push_gets_the_first_answer_and_item(self, store: Store):
        """One event twice, in one group and after it: one item, every answer the first's, repeats flagged."""
        async with running(store) as writer:
            def push(answer: bytes) -> Any:
                return lambda: writer.store_push(PushClaim("disc", "e-1", answer, 1), make_item("tick"))

            first, second = await together(push(b'{"n":1}'), push(b'{"n":2}'))
            (third,) = await together(push(b'{"n":3}'))
            assert [w.answer for w in (first, second, third)] == [b'{"n":1}'] * 3
            assert [w.duplicate for w in (first, second, third)] == [False, True, True]
            assert first.item_id == second.item_id == third.item_id == (await store.items.list())[0].id

    async def test_each_operation_of_a_write_has_its_own_typed_result(self, store: Store):
        """`submit` answers by operation, not by position: each result is the one its operation declares."""
        async with running(store) as writer:
            items, count = InsertItems([make_item("a"), make_item("b")]), CountRows()
            committed = await writer.submit(count, items)
            assert [w.id for w in committed[items]] == [1, 2] and committed[count] == 2
            assert await writer.write(CountRows()) == 2
            with pytest.raises(KeyError):
                committed[CountRows()]  # not one of that write's
            with pytest.raises(TypeError):
                (first,) = committed  # noqa: F841 (no positions to unpack)

    async def test_an_operation_is_submitted_once_per_write(self, store: Store):
        """The same operation twice in one write is refused before anything is queued: its result would be ambiguous."""
        async with running(store) as writer:
            twice = InsertItems([make_item("a")])
            with pytest.raises(ValueError, match="once per write"):
                await writer.submit(twice, twice)
        assert await store.items.list() == []

    async def test_operations_of_one_write_run_by_stage(self, store: Store):
        """A later stage sees the rows an earlier stage stored in the same transaction."""
        async with running(store) as writer:
            count, _ = await submitted(writer, CountRows(), InsertItems([make_item(), make_item()]))
            assert count == 2

    async def test_a_failed_group_fails_every_write_logs_once_and_stores_nothing(self, store: Store):
        """If the transaction fails, no operation of the group is stored and every caller gets the error."""
        async with running(store) as writer:
            async def failing() -> Any:
                with pytest.raises(RuntimeError, match="disk on fire"):
                    await writer.submit(InsertItems([make_item("lost")]), Explode())

            async def bystander() -> Any:
                with pytest.raises(RuntimeError, match="disk on fire"):
                    await writer.store_items([make_item("also lost")])

            with capture_logs() as logs:
                await together(failing, bystander)
            failures = [e for e in logs if e["event"] == "store.group_failed"]
            assert len(failures) == 1 and failures[0]["exc_info"] is True and failures[0]["writes"] == 2
            assert await store.items.list() == [] and writer.stats["failed"] == 2
            assert len(await writer.store_items([make_item("next")])) == 1  # the writer carries on
