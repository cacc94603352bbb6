"""RowCache against the store's own read: whatever the interleaving, an agent's rows are exactly `context_rows`."""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.agents.turns.row_cache import RowCache
from mcplhost.store import NewItem, open_store

from ..properties import examples

WHO = st.sampled_from([None, "a", "b"])
STEPS = st.lists(st.tuples(st.sampled_from(["insert", "read"]), WHO), min_size=1, max_size=30)


def row(who: str | None, n: int) -> NewItem:
    return NewItem(role="user" if who is None else "assistant", content=[{"type": "text", "text": f"r{n}"}],
                   metadata={}, created_at=n, agent=who)


async def replay(folder: Path, limit: int, steps: list[tuple[str, str | None]]) -> None:
    async with open_store(folder / "host.db") as store:
        cache = RowCache(store.items, limit)
        for n, (action, who) in enumerate(steps):
            if action == "insert":
                await store.items.insert_many([row(who, n)])
            elif who is not None:
                got = [r.id for r in await cache.rows_for(who)]
                want = [r.id for r in await store.items.context_rows(who, limit=limit)]
                assert got == want, (n, who)


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(min_value=1, max_value=5), STEPS)
def test_cached_rows_equal_the_store_s_context_rows(limit: int, steps: list[tuple[str, str | None]]) -> None:
    """Inserts of everyone's and two agents' rows interleaved with reads: every read matches the store's."""
    with tempfile.TemporaryDirectory() as folder:
        anyio.run(replay, Path(folder), limit, steps)


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
        await store.items.insert_many([row(None, 10)])
        assert len(await cache.rows_for("a")) == 11 and asked == [10]
