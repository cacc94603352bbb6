"""Tests for mcplhost/store/pushes.py: one claim per push event, its answer and item kept, old ones pruned."""

from __future__ import annotations

from mcplhost.store import PUSH_DEDUP_WINDOW_MS, PushClaim, Store

from .conftest import make_item


def claim(event_id: str = "e-1", answer: bytes = b'{"accepted":true}', created_at: int = 1_000,
          server: str = "discord") -> PushClaim:
    return PushClaim(server, event_id, answer, created_at)


class TestPushRepository:
    async def test_unknown_event_has_no_answer(self, store: Store):
        """get returns None for an event never recorded."""
        assert await store.pushes.get("discord", "e-1") is None

    async def test_first_claim_wins_and_is_kept(self, store: Store):
        """A new event's claim wins; its answer is what get returns, per (server, event)."""
        async with store.transaction():
            (outcome,) = await store.pushes.claim_many([claim()])
        assert outcome.claimed and outcome.answer == b'{"accepted":true}' and outcome.item_id is None
        assert await store.pushes.get("discord", "e-1") == b'{"accepted":true}'
        assert await store.pushes.get("zulip", "e-1") is None

    async def test_repeat_gets_the_original_answer_and_item(self, store: Store):
        """A claim of a committed event loses and carries the first answer and the attached item id."""
        async with store.transaction():
            await store.pushes.claim_many([claim(answer=b'{"n":1}')])
            (written,) = await store.items.insert_many_nocommit([make_item("first")])
            await store.pushes.attach_items_nocommit([("discord", "e-1", written.id)])
        async with store.transaction():
            (again,) = await store.pushes.claim_many([claim(answer=b'{"n":2}', created_at=2_000)])
        assert (again.claimed, again.answer, again.item_id) == (False, b'{"n":1}', written.id)
        assert await store.pushes.get("discord", "e-1") == b'{"n":1}'

    async def test_repeat_in_one_batch_is_answered_like_the_first(self, store: Store):
        """Two claims of one event in one call: the first wins, the second loses with the first's answer."""
        async with store.transaction():
            outcomes = await store.pushes.claim_many([claim(answer=b"1"), claim("e-2"), claim(answer=b"2")])
        assert [(o.claimed, o.answer) for o in outcomes] == [
            (True, b"1"), (True, b'{"accepted":true}'), (False, b"1")]

    async def test_a_rolled_back_claim_leaves_the_event_new(self, store: Store):
        """A claim undone with its transaction does not count: the next delivery wins."""
        try:
            async with store.transaction():
                await store.pushes.claim_many([claim()])
                raise RuntimeError("boom")
        except RuntimeError:
            pass
        async with store.transaction():
            (outcome,) = await store.pushes.claim_many([claim()])
        assert outcome.claimed

    async def test_prune_drops_only_records_older_than_the_window(self, store: Store):
        """prune deletes records created before the cutoff and reports how many it removed."""
        now = 10 * PUSH_DEDUP_WINDOW_MS
        async with store.transaction():
            await store.pushes.claim_many([claim("old", created_at=now - PUSH_DEDUP_WINDOW_MS - 1),
                                           claim("edge", created_at=now - PUSH_DEDUP_WINDOW_MS),
                                           claim("new", created_at=now)])
        assert await store.pushes.prune(now - PUSH_DEDUP_WINDOW_MS) == 1
        assert await store.pushes.get("discord", "old") is None
        assert await store.pushes.get("discord", "edge") is not None
        assert await store.pushes.prune(now - PUSH_DEDUP_WINDOW_MS) == 0
