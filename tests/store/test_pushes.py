"""Tests for mcplhost/store/pushes.py: the first answer to each push event, kept and pruned."""

from __future__ import annotations

import pytest

from mcplhost.store import PUSH_DEDUP_WINDOW_MS, DuplicatePushEvent, Store

from .conftest import make_item


class TestPushRepository:
    async def test_unknown_event_has_no_answer(self, store: Store):
        """get returns None for an event never recorded."""
        assert await store.pushes.get("discord", "e-1") is None

    async def test_recorded_answer_comes_back_verbatim(self, store: Store):
        """The recorded JSON bytes come back unchanged, per server and event id."""
        answer = '{"accepted":true,"itemIds":[1],"note":"é"}'.encode()
        async with store.transaction():
            await store.pushes.record_nocommit("discord", "e-1", answer, 1_000)
        assert await store.pushes.get("discord", "e-1") == answer
        assert await store.pushes.get("zulip", "e-1") is None

    async def test_duplicate_raises_and_its_items_roll_back(self, store: Store):
        """Recording an event twice raises DuplicatePushEvent and the second delivery's items are not kept."""
        async with store.transaction():
            await store.items.insert_many_nocommit([make_item("first")])
            await store.pushes.record_nocommit("discord", "e-1", b'{"n":1}', 1_000)
        with pytest.raises(DuplicatePushEvent):
            async with store.transaction():
                await store.items.insert_many_nocommit([make_item("again")])
                await store.pushes.record_nocommit("discord", "e-1", b'{"n":2}', 2_000)
        assert [item.content[0]["text"] for item in await store.items.list()] == ["first"]
        assert await store.pushes.get("discord", "e-1") == b'{"n":1}'

    async def test_prune_removes_only_older_records(self, store: Store):
        """prune deletes records created before the cutoff and reports how many."""
        now = 10 * PUSH_DEDUP_WINDOW_MS
        async with store.transaction():
            await store.pushes.record_nocommit("discord", "old", b"{}", now - PUSH_DEDUP_WINDOW_MS - 1)
            await store.pushes.record_nocommit("discord", "edge", b"{}", now - PUSH_DEDUP_WINDOW_MS)
            await store.pushes.record_nocommit("discord", "new", b"{}", now)
        assert await store.pushes.prune(now - PUSH_DEDUP_WINDOW_MS) == 1
        assert await store.pushes.get("discord", "old") is None
        assert await store.pushes.get("discord", "edge") == b"{}"
        assert await store.pushes.prune(now - PUSH_DEDUP_WINDOW_MS) == 0
