"""The agents' feed on a shared store (agents/follow.py): every item after the mark once, in id order, pages read on
at once, a failed read leaving the mark, and a notification only a nudge, whatever its payload."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.agents import follow
from mcplhost.agents.follow import ItemsFollower
from mcplhost.ingest import Stored
from mcplhost.store import NewItem

from .support import agent_store, heard


class Failing:
    """A store read that fails, as one whose server went away does."""

    async def after_as_written(self, item_id: int, *, since_ms: int = 0,
                               limit: int | None = None) -> list[tuple[int, NewItem]]:
        raise OSError("connection refused")


async def test_each_item_after_the_mark_is_offered_once_in_order_a_page_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "FOLLOW_PAGE", 2)
    async with agent_store(tmp_path) as (store, _writer, ingest):
        ids = await heard(ingest, "one", "two", "three", "four", "five")
        offered: list[Stored] = []
        follower = ItemsFollower(store.items, after=ids[0], offer=offered.append)
        assert await follower.read_once() is True  # a full page: read on at once
        assert await follower.read_once() is True
        assert await follower.read_once() is False
        assert [event.id for event in offered] == ids[1:] and follower.mark == ids[-1]
        assert [event.item.content for event in offered] == [i.content for i in await store.items.get_many(ids[1:])]
        assert await follower.read_once() is False and len(offered) == 4  # nothing new: nothing offered again


async def test_a_failed_read_keeps_the_mark_and_the_next_reads_from_it(tmp_path: Path) -> None:
    async with agent_store(tmp_path) as (store, _writer, ingest):
        ids = await heard(ingest, "one", "two")
        offered: list[Stored] = []
        follower = ItemsFollower(Failing(), after=0, offer=offered.append)
        assert await follower.read_once() is False and follower.mark == 0 and offered == []
        follower._items = store.items  # the server is back
        assert await follower.read_once() is False
        assert [event.id for event in offered] == ids


async def test_run_reads_on_a_nudge_and_on_the_poll(tmp_path: Path) -> None:
    async with agent_store(tmp_path) as (store, _writer, ingest), anyio.create_task_group() as tg:
        arrived = anyio.Event()
        offered: list[int] = []

        def offer(event: Stored) -> None:
            offered.append(event.id)
            arrived.set()

        follower = ItemsFollower(store.items, after=await store.items.last_id(), offer=offer, poll_s=3600)
        tg.start_soon(follower.run)
        (first,) = await heard(ingest, "one")
        follower.nudge()
        with anyio.fail_after(5):
            await arrived.wait()
        assert offered == [first]
        tg.cancel_scope.cancel()
    async with agent_store(tmp_path / "polled") as (store, _writer, ingest), anyio.create_task_group() as tg:
        arrived = anyio.Event()
        offered = []
        follower = ItemsFollower(store.items, after=0, offer=offer, poll_s=0.05)
        (first,) = await heard(ingest, "one")
        tg.start_soon(follower.run)  # never nudged: the poll reads it
        with anyio.fail_after(5):
            await arrived.wait()
        assert offered == [first]
        tg.cancel_scope.cancel()


@given(st.text(max_size=5000))
def test_any_payload_nudges_unless_it_is_an_id_already_read(payload: str) -> None:
    async def check() -> bool:
        follower = ItemsFollower(Failing(), after=1000, offer=lambda event: None)
        follower.heard(payload)  # never raises
        return follower._nudged.is_set()

    expected = not (payload.isascii() and payload.isdigit() and len(payload) <= follow.ID_DIGITS
                    and int(payload) <= 1000)
    assert anyio.run(check) is expected
