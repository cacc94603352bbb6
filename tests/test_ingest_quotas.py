"""Per-connector quotas in ingest (mcplhost/ingest/service.py): refusals itemised, counted in the store, one spell.

A real store and group writer, and a clock the test moves (`clock_ms`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from structlog.testing import capture_logs

from mcplhost.ingest import Ingest
from mcplhost.ingest.quotas import QuotaLimits
from mcplhost.protocol import errors
from mcplhost.speech.echoes import EchoMemory
from mcplhost.store import QUOTA_BUCKET_MS, QUOTA_WINDOW_MS, body_bytes, bucket_of, open_store
from mcplhost.store.writer import GroupWriter

from .builders import admitted_message, admitted_push
from .harness import logged

ROOM = "disc:g1:room"
START = 1_790_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> int:
        return self.now


@asynccontextmanager
async def ingest(folder: Path, clock: Clock, **limits: int) -> AsyncIterator[Ingest]:
    """A fresh Ingest (as after a restart) over the store in `folder`, with `disc`'s quotas."""
    async with open_store(folder / "host.db") as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        yield Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox), clock_ms=clock,
                     quotas={"disc": QuotaLimits(**limits)})
        tg.cancel_scope.cancel()


async def send(intake: Ingest, *ids: str, body: str = "hello") -> list[dict[str, Any]]:
    return await intake.store_messages("disc", "channels/incoming", [admitted_message(i, body) for i in ids])


def accepted(results: list[dict[str, Any]]) -> list[bool]:
    return [r["accepted"] for r in results]


def stored_rows(folder: Path) -> int:
    with sqlite3.connect(folder / "host.db") as conn:
        return conn.execute("SELECT count(*) FROM items").fetchone()[0]


class TestItemsQuota:
    async def test_the_fourth_message_in_an_hour_is_refused_itemised(self, tmp_path: Path) -> None:
        """max_items_per_hour = 3: three stored, the fourth refused with reason quota, the batch goes on."""
        clock = Clock()
        async with ingest(tmp_path, clock, max_items=3) as intake:
            assert accepted(await send(intake, "m-1", "m-2")) == [True, True]
            clock.now += 1000
            results = await send(intake, "m-3", "m-4")
        assert accepted(results) == [True, False]
        assert results[1] == {"messageId": "m-4", "accepted": False, "reason": "quota", "code": errors.INTERNAL_ERROR,
                              "quota": "items",
                              "retryAfterMs": bucket_of(START) + QUOTA_WINDOW_MS - clock.now}
        assert stored_rows(tmp_path) == 3

    async def test_a_restart_still_refuses_and_an_hour_later_admits(self, tmp_path: Path) -> None:
        """The counts are in the store: a new Ingest over the reopened store refuses; the hour sliding on admits."""
        clock = Clock()
        async with ingest(tmp_path, clock, max_items=3) as intake:
            assert accepted(await send(intake, "m-1", "m-2", "m-3")) == [True, True, True]
        clock.now += 30 * QUOTA_BUCKET_MS
        async with ingest(tmp_path, clock, max_items=3) as intake:
            assert accepted(await send(intake, "m-4")) == [False]
            assert intake.quota_statistics()["disc"]["items"] == 3
        clock.now = bucket_of(START) + QUOTA_WINDOW_MS  # the first minute has left the hour
        async with ingest(tmp_path, clock, max_items=3) as intake:
            assert accepted(await send(intake, "m-4", "m-5", "m-6", "m-7")) == [True, True, True, False]
        assert stored_rows(tmp_path) == 6

    async def test_a_redelivery_takes_nothing_of_the_quota(self, tmp_path: Path) -> None:
        """An identical redelivery stores nothing, so it is answered as the first and counts nothing."""
        clock = Clock()
        async with ingest(tmp_path, clock, max_items=2) as intake:
            first = await send(intake, "m-1")
            assert await send(intake, "m-1") == first
            assert accepted(await send(intake, "m-1", "m-2", "m-3")) == [True, True, False]
            assert intake.quota_statistics()["disc"]["items"] == 2
        async with ingest(tmp_path, clock, max_items=2) as intake:  # the store counted the same
            assert intake.quota_statistics() == {}
            assert accepted(await send(intake, "m-4")) == [False]

    async def test_near_the_quota_repeats_in_one_batch_pass(self, tmp_path: Path) -> None:
        """At the limit, a message stored already and one repeated within the batch are answered, not refused."""
        clock = Clock()
        async with ingest(tmp_path, clock, max_items=2) as intake:
            await send(intake, "m-1")
            results = await send(intake, "m-1", "m-2", "m-2", "m-3")
            assert accepted(results) == [True, True, True, False]
            assert results[1]["conversationId"] == results[2]["conversationId"]
            assert intake.quota_statistics()["disc"]["items"] == 2
        assert stored_rows(tmp_path) == 2

    async def test_quotas_are_per_connector(self, tmp_path: Path) -> None:
        clock = Clock()
        async with ingest(tmp_path, clock, max_items=1) as intake:
            assert accepted(await send(intake, "m-1", "m-2")) == [True, False]
            other = await intake.store_messages("zulip", "channels/incoming",
                                                [admitted_message("m-1"), admitted_message("m-2")])
            assert accepted(other) == [True, True]  # not configured here: the generous defaults


    async def test_new_limits_apply_to_the_next_message_and_keep_the_count(self, tmp_path: Path) -> None:
        """As a reload does: raising the quota admits at once, the hour's count goes on."""
        async with ingest(tmp_path, Clock(), max_items=1) as intake:
            assert accepted(await send(intake, "m-1", "m-2")) == [True, False]
            intake.set_quotas({"disc": QuotaLimits(max_items=2)})
            assert accepted(await send(intake, "m-2", "m-3")) == [True, False]
            assert intake.quota_statistics()["disc"]["maxItems"] == 2


class TestBytesQuota:
    async def test_a_message_past_the_bytes_quota_is_refused_and_a_smaller_one_fits(self, tmp_path: Path) -> None:
        """Stored body bytes: the content blocks' JSON. A big message is refused; a small one after it still fits."""
        clock = Clock()
        async with ingest(tmp_path / "measure", clock) as intake:  # the stored size: with its header block
            await send(intake, "m-0", body="x" * 100)
            size = intake.quota_statistics()["disc"]["bytes"]
        with sqlite3.connect(tmp_path / "measure" / "host.db") as conn:
            assert conn.execute("SELECT length(CAST(content AS BLOB)), body_bytes FROM items, quota_usage").fetchone() == (size, size)
        assert size > body_bytes([{"type": "text", "text": "x" * 100}])
        async with ingest(tmp_path, clock, max_bytes=2 * size + size // 2) as intake:
            results = await send(intake, "m-1", "m-2", "m-3", body="x" * 100)
            assert accepted(results) == [True, True, False]
            assert results[2]["quota"] == "bytes"
            assert accepted(await send(intake, "m-4", body="x")) == [True]
        async with ingest(tmp_path, clock, max_bytes=2 * size + size // 2) as intake:  # a restart still refuses
            assert accepted(await send(intake, "m-5", body="x" * 100)) == [False]
            clock.now = bucket_of(START) + QUOTA_WINDOW_MS
            assert accepted(await send(intake, "m-5", body="x" * 100)) == [True]

    async def test_a_message_larger_than_the_quota_alone_says_no_retry(self, tmp_path: Path) -> None:
        async with ingest(tmp_path, Clock(), max_bytes=50) as intake:
            (result,) = await send(intake, "m-1", body="x" * 100)
        assert result["reason"] == "quota" and result["quota"] == "bytes" and "retryAfterMs" not in result


class TestPushes:
    async def test_a_push_past_the_quota_gets_the_quota_error(self, tmp_path: Path) -> None:
        """A push counts like a message; past the quota its request fails with -32603, reason quota."""
        clock = Clock()
        async with ingest(tmp_path, clock, max_items=2) as intake:
            await send(intake, "m-1")
            stored = await intake.store_push("disc", admitted_push("e-1"))
            assert not stored.duplicate
            assert (await intake.store_push("disc", admitted_push("e-1"))).duplicate  # a repeat: nothing counted
            with pytest.raises(errors.ConnectorProtocolError) as refused:
                await intake.store_push("disc", admitted_push("e-2"))
            assert refused.value.code == errors.INTERNAL_ERROR
            assert refused.value.data["reason"] == "quota" and refused.value.data["quota"] == "items"
            assert accepted(await send(intake, "m-2")) == [False]
        assert stored_rows(tmp_path) == 2


class TestSpells:
    async def test_one_warning_per_spell_and_an_info_when_it_ends(self, tmp_path: Path) -> None:
        """Many refusals, one `connector.quota_reached`; the first admission a minute after the last refusal ends it."""
        clock = Clock()
        with capture_logs() as logs:
            async with ingest(tmp_path, clock, max_items=1) as intake:
                await send(intake, "m-1", "m-2", "m-3")
                clock.now += 1000
                await send(intake, "m-4", "m-5")
                with pytest.raises(errors.ConnectorProtocolError):
                    await intake.store_push("disc", admitted_push("e-1"))
                assert intake.quota_statistics()["disc"] == {
                    "items": 1, "bytes": intake.quota_statistics()["disc"]["bytes"], "maxItems": 1,
                    "maxBytes": QuotaLimits().max_bytes, "refusedItems": 5, "refusedBytes": 0, "reached": True}
                clock.now += QUOTA_WINDOW_MS
                assert accepted(await send(intake, "m-6")) == [True]
                assert intake.quota_statistics()["disc"]["reached"] is False
                await send(intake, "m-7")  # a new spell
        reached = logged(logs, "connector.quota_reached", connector="disc")
        assert [(e["quota"], e["limit"], e["log_level"]) for e in reached] == [("items", 1, "warning")] * 2
        ended = logged(logs, "connector.quota_ended", connector="disc")
        assert [(e["refused_items"], e["refused_bytes"]) for e in ended] == [(5, 0)]
