"""Retention on a store several hosts share (mcplhost/store/retention.py, docs/operations.md#retention): one host
prunes at a time; a pass that finds another host's lock is skipped, on a real PostgreSQL server."""

from __future__ import annotations

from pathlib import Path

import structlog

from mcplhost.config import Config, HostConfig, StoreConfig
from mcplhost.store import open_store

from ..harness import running_host, wait_for
from ..postgres import PostgresDatabase
from .test_retention import NOW, RECENT, ids, seed


async def test_a_pass_while_another_host_prunes_is_refused_and_the_next_one_prunes(
        postgres_db: PostgresDatabase) -> None:
    """Host a holds the pass's lock: host b may not prune; once a's pass ends, b's pass (a pool of one connection:
    the lock is held beside the pool) takes it and prunes the old items."""
    async with open_store(postgres_db.url, pool_size=2) as a, open_store(postgres_db.url, pool_size=1) as b:
        old = await seed(a, 5)
        recent = await seed(a, 1, created_at=RECENT)
        async with a.retention.sole_pass() as mine:
            assert mine
            async with b.retention.sole_pass() as theirs:
                assert not theirs
        async with b.retention.sole_pass() as mine:
            assert mine
            pruned = await b.retention.prune(retention_days=7, agents=(), context_rows=2000, now_ms=NOW)
            async with a.retention.sole_pass() as theirs:
                assert not theirs
        assert pruned.removed == len(old)
        assert await ids(b) == recent


async def test_a_host_on_a_shared_store_takes_the_lock_before_its_pass(
        postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    """`run`'s retention task on PostgreSQL: its first pass, at start, is skipped while another host prunes."""
    async with open_store(postgres_db.url, pool_size=1) as other:
        await seed(other, 3, created_at=1_000)
        with structlog.testing.capture_logs() as logged:
            async with other.retention.sole_pass() as mine, running_host(Config(
                    store=StoreConfig(url=postgres_db.url, state_dir=str(tmp_path), retention_days=1),
                    host=HostConfig(name="b"))):
                assert mine
                await wait_for(lambda: [e for e in logged if e["event"] == "store.retention_skipped"])
            assert len(await ids(other)) == 3
        assert not [e for e in logged if e["event"] == "store.retention_failed"]
