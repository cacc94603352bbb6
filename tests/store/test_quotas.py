"""Quota usage in the store (mcplhost/store/quotas.py, migration 0007): summed per minute, pruned, committed with its items."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import anyio
import msgspec
import pytest

from mcplhost.store import QUOTA_BUCKET_MS, QUOTA_WINDOW_MS, PushClaim, QuotaCharge, QuotaUsage, Store, bucket_of
from mcplhost.store.interfaces import Repositories
from mcplhost.store.operations import InsertItems
from mcplhost.store.writer import GroupWriter

from .conftest import make_item

START = bucket_of(1_790_000_000_000)


class Explode(msgspec.Struct, frozen=True):
    """An operation that fails after the items' stage, so the group rolls back."""

    STAGE: ClassVar[int] = 20

    @classmethod
    async def apply_all(cls, repos: Repositories, ops: Sequence[Explode]) -> list[None]:
        raise RuntimeError("disk on fire")


async def add(store: Store, *charges: QuotaCharge) -> None:
    async with store.transaction():
        await store.quotas.add_many_nocommit(charges)


class TestUsage:
    async def test_charges_sum_per_connector_and_minute(self, store: Store) -> None:
        await add(store, QuotaCharge("disc", START + 5, 1, 100), QuotaCharge("disc", START + 59_999, 2, 50))
        await add(store, QuotaCharge("disc", START + QUOTA_BUCKET_MS, 1, 7), QuotaCharge("zulip", START, 1, 1))
        assert await store.quotas.usage_since("disc", START) == [
            QuotaUsage(START, 3, 150), QuotaUsage(START + QUOTA_BUCKET_MS, 1, 7)]
        assert await store.quotas.usage_since("disc", START + QUOTA_BUCKET_MS) == [
            QuotaUsage(START + QUOTA_BUCKET_MS, 1, 7)]
        assert await store.quotas.usage_since("zulip", 0) == [QuotaUsage(START, 1, 1)]

    async def test_minutes_older_than_the_hour_are_deleted_by_later_charges(self, store: Store) -> None:
        """The table holds at most an hour of minutes per connector: it never grows with time."""
        await add(store, QuotaCharge("disc", START, 1, 1), QuotaCharge("zulip", START, 1, 1))
        await add(store, QuotaCharge("disc", START + QUOTA_WINDOW_MS - 1, 1, 1))
        assert [u.bucket_start for u in await store.quotas.usage_since("disc", 0)] == [
            START, START + QUOTA_WINDOW_MS - QUOTA_BUCKET_MS]
        await add(store, QuotaCharge("disc", START + QUOTA_WINDOW_MS, 1, 1))
        assert [u.bucket_start for u in await store.quotas.usage_since("disc", 0)] == [
            START + QUOTA_WINDOW_MS - QUOTA_BUCKET_MS, START + QUOTA_WINDOW_MS]
        assert len(await store.quotas.usage_since("zulip", 0)) == 1  # another connector's minutes are its own

    async def test_a_charge_counts_up(self, store: Store) -> None:
        with pytest.raises(ValueError, match="counts up"):
            await add(store, QuotaCharge("disc", START, -1, 0))


class TestWrittenWithTheItems:
    async def test_only_items_really_stored_are_counted(self, store: Store) -> None:
        """A repeated channel item stores nothing and counts nothing; pushes count once per event."""
        writer = GroupWriter(store)
        base = make_item("a", created_at=START)
        item = msgspec.structs.replace(base, metadata={**base.metadata, "messageId": "m-1"}, dedup_digest="d-1")
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            await writer.store_items([item, item], charged_to="discord", body_bytes=[10, 10])
            await writer.store_items([item], charged_to="discord", body_bytes=[10])
            claim = PushClaim("discord", "e-1", b"{}", START)
            await writer.store_push(claim, make_item("p", created_at=START), body_bytes=5)
            await writer.store_push(claim, make_item("p", created_at=START), body_bytes=5)
            await writer.store_items([make_item("uncounted", created_at=START)])
            tg.cancel_scope.cancel()
        assert await store.quotas.usage_since("discord", 0) == [QuotaUsage(START, 2, 15)]

    async def test_a_failed_group_counts_nothing(self, store: Store) -> None:
        writer = GroupWriter(store)
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            with pytest.raises(RuntimeError, match="disk on fire"):
                await writer.submit(InsertItems([make_item("lost", created_at=START)], "discord", [10]), Explode())
            tg.cancel_scope.cancel()
        assert await store.items.list() == []
        assert await store.quotas.usage_since("discord", 0) == []

    def test_charged_items_need_their_sizes(self) -> None:
        with pytest.raises(ValueError, match="body bytes"):
            InsertItems([make_item()], "discord", [])
