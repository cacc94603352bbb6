"""The session's outgoing queue (mcplhost/rpc/outgoing.py): order, bounds, closing and abandoning."""

from __future__ import annotations

import anyio
import pytest

from mcplhost.rpc.outgoing import OutgoingLines


async def test_take_returns_every_line_in_order_then_nothing_once_closed() -> None:
    queue = OutgoingLines[bytes](8)
    queue.put_nowait(b"a")
    assert queue.offer(b"b")
    queue.close()
    assert await queue.take() == [b"a", b"b"]
    assert await queue.take() == []
    with pytest.raises(anyio.ClosedResourceError):
        queue.put_nowait(b"late")
    assert not queue.offer(b"late")


async def test_a_full_queue_refuses_now_and_lets_put_wait_for_room() -> None:
    queue = OutgoingLines[bytes](2)
    queue.put_nowait(b"1")
    queue.put_nowait(b"2")
    assert not queue.offer(b"3")
    with pytest.raises(anyio.WouldBlock):
        queue.put_nowait(b"3")
    async with anyio.create_task_group() as tg:
        tg.start_soon(queue.put, b"3")
        await anyio.wait_all_tasks_blocked()
        assert await queue.take() == [b"1", b"2"]  # room: the waiting sender queues its line
    assert await queue.take() == [b"3"]


async def test_the_reader_waits_for_a_line() -> None:
    queue = OutgoingLines[bytes](4)
    taken: list[list[bytes]] = []
    async with anyio.create_task_group() as tg:
        async def reader() -> None:
            taken.append(await queue.take())

        tg.start_soon(reader)
        await anyio.wait_all_tasks_blocked()
        queue.put_nowait(b"x")
    assert taken == [[b"x"]]


async def test_abandoned_means_broken_for_every_sender_waiting_or_not() -> None:
    queue = OutgoingLines[bytes](1)
    queue.put_nowait(b"held")
    failures: list[type[BaseException]] = []
    async with anyio.create_task_group() as tg:
        async def sender() -> None:
            try:
                await queue.put(b"waiting")
            except anyio.BrokenResourceError as exc:
                failures.append(type(exc))

        tg.start_soon(sender)
        await anyio.wait_all_tasks_blocked()
        queue.abandon()
    assert failures == [anyio.BrokenResourceError]
    with pytest.raises(anyio.BrokenResourceError):
        queue.put_nowait(b"after")
    assert await queue.take() == []
