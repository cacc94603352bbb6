"""Hosts sharing one PostgreSQL store (store/hosts.py): the hosts table and connector ownership by advisory lock."""

from __future__ import annotations

import anyio
import asyncpg
import pytest
from anyio.abc import TaskStatus
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.store import StoreError, hosts, open_store
from mcplhost.store.hosts import LIVE_BOUND_MS, HostIdentity, Sharing
from mcplhost.store.order import ITEMS_ORDER_KEY, MIGRATION_KEY, ownership_key
from tests.postgres import PostgresDatabase


def identity(name: str, pid: int) -> HostIdentity:
    return HostIdentity(name=name, pid=pid, version="9.9", started_at=1_000)


@given(st.text(max_size=64), st.text(max_size=64))
def test_ownership_keys_are_stable_bigints_apart_by_kind_and_name(first: str, second: str) -> None:
    key = ownership_key("connector", first)
    assert key == ownership_key("connector", first) and -(2**63) <= key < 2**63
    assert key not in (ITEMS_ORDER_KEY, MIGRATION_KEY, ownership_key("agent", first))
    assert (key == ownership_key("connector", second)) == (first == second)


async def test_a_connector_owned_by_one_session_waits_on_the_other_until_that_session_dies(
        migrated_db: PostgresDatabase) -> None:
    """A holds `chat`; B's try fails and it stands by; the server ending A's session (a host killed) frees the lock
    and B's standby takes it, without A ever releasing it. Each host lists what it owns."""
    async with open_store(migrated_db.url) as store_a, open_store(migrated_db.url) as store_b, \
            store_b.session() as session_b, anyio.create_task_group() as tg:
        b = Sharing(session_b, identity("b", 2))
        await tg.start(b.run)
        assert await b.try_own("scout", kind="agent")  # an agent's key space is not a connector's
        assert await b.try_own("scout") and "scout" in b.owned and b.agents == ["scout"]
        await b.release("scout")
        async with store_a.session() as session_a:
            ((a_pid,),) = await session_a.fetch("SELECT pg_backend_pid()")
            a = Sharing(session_a, identity("a", 1))
            a_beats = anyio.CancelScope()

            async def beat_a(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
                with a_beats:
                    await a.run(task_status=task_status)

            await tg.start(beat_a)
            assert await a.try_own("chat") and await a.try_own("chat")  # held: a second try holds it still
            assert not await b.try_own("chat")
            waiting = anyio.Event()

            async def stand_by() -> None:
                waiting.set()
                await b.own("chat")

            tg.start_soon(stand_by)
            await waiting.wait()
            assert b.is_standby("chat") and not a.is_standby("chat")
            with anyio.fail_after(5):  # A's take-over is published at once, not at its next beat
                while [(h.name, h.connectors) for h in await b.live_hosts()] != [("a", ["chat"]), ("b", [])]:
                    await anyio.sleep(0.05)
            assert await b.owner_of("chat") == "a" and await a.owner_of("chat") is None
            hosts = await b.live_hosts()
            assert [(h.pid, h.version, h.started_at, h.agents) for h in hosts] == [(1, "9.9", 1_000, []),
                                                                                (2, "9.9", 1_000, ["scout"])]
            assert all(0 <= h.heartbeat_age_ms < LIVE_BOUND_MS for h in hosts)
            a_beats.cancel()  # A's heartbeats stop (its row goes); the lock stays with its session
            assert not await b.try_own("chat")
            killer = await asyncpg.connect(migrated_db.url)
            try:  # the server ends A's session, as when A's machine dies: no unlock is ever sent
                killed = await killer.fetchval("SELECT pg_terminate_backend($1)", a_pid)
            finally:
                await killer.close()
            assert killed
            with anyio.fail_after(10):
                while "chat" not in b.owned:
                    await anyio.sleep(0.05)
            assert not b.is_standby("chat")
            with pytest.raises(StoreError, match="host a: the store session holding its connector locks failed"):
                await a.try_own("other")  # A's session is gone: it owns nothing, and says so in one line
            tg.cancel_scope.cancel()


async def test_a_heartbeat_older_than_the_bound_or_an_ended_session_is_not_live_and_a_clean_stop_leaves(
        migrated_db: PostgresDatabase) -> None:
    async with open_store(migrated_db.url) as store, store.session() as session:
        ((live_pid,),) = await session.fetch("SELECT pg_backend_pid()")
        async with anyio.create_task_group() as tg:
            me = Sharing(session, identity("me", 7))
            await tg.start(me.run)
            other = await asyncpg.connect(migrated_db.url)  # not `session`: its heartbeats may be using it
            try:
                await other.execute(
                    "INSERT INTO hosts (name, pid, version, started_at, heartbeat_at, connectors, agents, session_pid)"
                    " VALUES ('old', 3, '1', 0, 0, '[\"chat\"]', '[]', $1), ('ended', 4, '1', 0,"
                    " (extract(epoch FROM clock_timestamp()) * 1000)::bigint, '[\"chat\"]', '[]', -1)", live_pid)
            finally:
                await other.close()
            assert [h.name for h in await me.live_hosts()] == ["me"]  # a stale heartbeat, a session that ended
            assert await me.owner_of("chat") is None
            tg.cancel_scope.cancel()
        rows = await session.fetch("SELECT name FROM hosts ORDER BY name")
        assert rows == [("ended",), ("old",)]  # its own row deleted on the way out


async def test_a_session_the_server_ends_stops_the_host_at_once_not_at_its_next_heartbeat(
        migrated_db: PostgresDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its locks are gone the moment the session ends, so `run` raises then: a host never runs on beside the standby
    that takes them (the next beat is an hour away here: only noticing the end can stop it in time)."""
    monkeypatch.setattr(hosts, "HEARTBEAT_S", 3600.0)
    async with open_store(migrated_db.url) as store, store.session() as session:
        ((pid,),) = await session.fetch("SELECT pg_backend_pid()")
        me = Sharing(session, identity("me", 1))
        with pytest.raises(ExceptionGroup) as raised:
            async with anyio.create_task_group() as tg:
                await tg.start(me.run)
                killer = await asyncpg.connect(migrated_db.url)
                try:
                    assert await killer.fetchval("SELECT pg_terminate_backend($1)", pid)
                finally:
                    await killer.close()
                with anyio.fail_after(10):
                    await anyio.sleep_forever()  # `run` raising cancels this
        assert raised.group_contains(StoreError, match="host me: the store session holding its connector locks failed")
