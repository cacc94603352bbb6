"""RowCache against the store's own read: whatever the interleaving, an agent's rows are exactly `context_rows`."""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.agents.turns.row_cache import RowCache
from mcplhost.store import NewItem, Store, open_store
from mcplhost.store.items import ItemWritten

from ..properties import examples

WHO = st.sampled_from([None, "a", "b"])
STEPS = st.lists(st.tuples(st.sampled_from(["insert", "read"]), WHO), min_size=1, max_size=30)


def row(who: str | None, n: int) -> NewItem:
    return NewItem(role="user" if who is None else "assistant", content=[{"type": "text", "text": f"r{n}"}],
                   metadata={}, created_at=n, agent=who)


async def assert_read_matches(cache: RowCache, store: Store, who: str, *, through: int, limit: int,
                              step: int) -> None:
    """The cache's rows for a wake on `through` are the store's context rows for that agent, id for id."""
    got = [r.id for r in await cache.rows_for(who, through=through)]
    want = [r.id for r in await store.items.context_rows(who, limit=limit)]
    assert got == want, (step, who)


async def replay(folder: Path, limit: int, steps: list[tuple[str, str | None]]) -> None:
    async with open_store(folder / "host.db") as store:
        cache = RowCache(store.items, limit)
        newest = 0
        for n, (action, who) in enumerate(steps):
            if action == "insert":  # nothing fed: each read is for a wake on the newest row, and reads the store
                (newest,) = await store.items.insert_many([row(who, n)])
            elif who is not None:
                await assert_read_matches(cache, store, who, through=newest, limit=limit, step=n)


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(min_value=1, max_value=5), STEPS)
def test_cached_rows_equal_the_store_s_context_rows(limit: int, steps: list[tuple[str, str | None]]) -> None:
    """Inserts of everyone's and two agents' rows interleaved with reads: every read matches the store's."""
    with tempfile.TemporaryDirectory() as folder:
        anyio.run(replay, Path(folder), limit, steps)


FED_STEPS = st.lists(st.tuples(st.sampled_from(["fed", "unfed", "refresh", "read", "read"]), WHO),
                     min_size=1, max_size=40)


async def replay_fed(folder: Path, limit: int, steps: list[tuple[str, str | None]]) -> None:
    """Rows fed as the host feeds them (ingest's events, a turn's InsertItems), or stored unfed (a CLI write, a
    publish's speech row: then its agent's turn ends), refreshes, and reads for a wake on the newest heard item."""
    async with open_store(folder / "host.db") as store:
        cache = RowCache(store.items, limit)
        newest_heard = 0
        for n, (action, who) in enumerate(steps):
            if action in ("fed", "unfed"):
                item = row(who, n)
                (item_id,) = await store.items.insert_many([item])
                if who is None:
                    newest_heard = item_id
                if action == "fed":
                    cache.feed_written([item], [ItemWritten(item_id, False, None)])
                elif who is not None:
                    cache.turn_ended(who)
            elif action == "refresh":
                await cache.refresh()
            elif who is not None:
                await assert_read_matches(cache, store, who, through=newest_heard, limit=limit, step=n)


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(min_value=1, max_value=5), FED_STEPS)
def test_fed_rows_equal_the_store_s_context_rows(limit: int, steps: list[tuple[str, str | None]]) -> None:
    """Fed and unfed rows of everyone and two agents, refreshes, and reads for a wake: every read matches the
    store's (an unfed row is read because of a gap, the wake, or its agent's turn having ended)."""
    with tempfile.TemporaryDirectory() as folder:
        anyio.run(replay_fed, Path(folder), limit, steps)


async def test_fed_rows_need_no_read_and_a_read_in_progress_holds_them(tmp_path: Path) -> None:
    """Rows fed with no gap are a turn's new rows without a read; rows fed while a read is in progress wait and
    are applied once, after it."""
    async with open_store(tmp_path / "host.db") as store:
        await store.items.insert_many([row(None, n) for n in range(5)])
        cache = RowCache(store.items, 100)
        assert len(await cache.rows_for("a")) == 5
        asked: list[int] = []
        after = store.items.after
        late = [row(None, 7), row("a", 8)]

        async def spy(item_id: int, **kwargs):
            asked.append(item_id)
            got = await after(item_id, **kwargs)
            ids = await store.items.insert_many(late)  # stored, and fed, while this read's answer is on its way
            cache.feed_written(late, [ItemWritten(i, False, None) for i in ids])
            return got

        fed = row(None, 5)
        (fed_id,) = await store.items.insert_many([fed])
        cache.feed_written([fed], [ItemWritten(fed_id, False, None)])
        store.items.after = spy  # type: ignore[method-assign]
        assert [r.id for r in await cache.rows_for("a", through=fed_id)] == [1, 2, 3, 4, 5, 6] and asked == []
        unfed = row(None, 6)
        (unfed_id,) = await store.items.insert_many([unfed])  # no event: the wake on it reads
        rows = await cache.rows_for("a", through=unfed_id)
        assert asked == [6]  # the read's 7, then the rows fed during it, once each
        assert [r.id for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
        assert [r.id for r in await cache.rows_for("a", through=9)] == [1, 2, 3, 4, 5, 6, 7, 8, 9] and asked == [6]


async def test_a_read_fetches_only_what_is_new(tmp_path: Path) -> None:
    """After the first read, rows already held are not read again: only ids after the last one are asked for."""
    async with open_store(tmp_path / "host.db") as store:
        await store.items.insert_many([row(None, n) for n in range(10)])
        cache = RowCache(store.items, 100)
        assert len(await cache.rows_for("a")) == 10
        asked: list[int] = []
        after = store.items.after

        async def spy(item_id: int, **kwargs):
            asked.append(item_id)
            return await after(item_id, **kwargs)

        store.items.after = spy  # type: ignore[method-assign]
        (newest,) = await store.items.insert_many([row(None, 10)])
        assert len(await cache.rows_for("a", through=newest)) == 11 and asked == [10]
