"""Agents on hosts sharing one PostgreSQL store (docs/operations.md#several-hosts-on-one-store): an agent hears the
items every host stores (NOTIFY, and the poll when a notification is lost), one live host runs each agent, a
standby takes it over from its durable cursor, and a flood from two hosts is woken for without a gap."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import msgspec
import pytest
from structlog.testing import capture_logs

from mcplhost.agents import follow
from mcplhost.agents.turns.record import OUTCOME_COMPLETED
from mcplhost.config import Config, HostConfig, StoreConfig
from mcplhost.control.status import check_problems, render_table
from mcplhost.host import Host, open_host
from mcplhost.ingest import Ingest
from mcplhost.protocol.intake import AdmittedMessage
from mcplhost.store import Store, StoreError
from mcplhost.store.hosts import Sharing

from ..harness import running_host
from ..postgres import PostgresDatabase
from .support import ROOM, HangingBackend, agent_config, scripted

_messages = iter(range(1, 10**9))


def host_config(url: str, name: str, folder: Path, *agents: str, **fields: Any) -> Config:
    """Host `name` on the database at `url`, no connector, running `agents` (woken by every item, scripted; `fields`
    of their tables)."""
    state = folder / name
    state.mkdir()
    return Config(store=StoreConfig(url=url, state_dir=str(state)), host=HostConfig(name=name),
                  agents=[agent_config(agent, backend=scripted("ok"), **fields) for agent in agents])


async def store_items(ingest: Ingest, count: int) -> None:
    """`count` channel messages stored through `ingest` (as a connector's would be), in one request."""
    await ingest.store_messages("disc", "channels/incoming", [
        AdmittedMessage(channel_id=ROOM, label="#room", message_id=f"m-{next(_messages)}", participant="Alice",
                        content=[{"type": "text", "text": "hello"}]) for _ in range(count)])


async def heard_ids(store: Store) -> list[int]:
    """The ids of the channel messages stored (not the agents' own rows), oldest first."""
    return [item.id for item in await store.items.list() if item.agent is None]


async def woken(store: Store, agent: str) -> list[int]:
    """Every item id in some completed turn of `agent`'s waking items, in turn order (an id twice: woken twice)."""
    return [item_id async for turn in store.turns.iterate(agent=agent)
            if turn.outcome == OUTCOME_COMPLETED for item_id in turn.wake_item_ids]


async def until(condition: Callable[[], Awaitable[Any]], timeout: float = 15.0) -> Any:
    """Await a condition over the store (another host's doing: there is no event here to wait on), bounded."""
    with anyio.fail_after(timeout):
        while not (value := await condition()):
            await anyio.sleep(0.05)
        return value


async def test_an_agent_is_woken_by_an_item_another_host_stored_by_its_notification(
        postgres_db: PostgresDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "POLL_S", 3600.0)  # only the notification can wake it in time
    async with running_host(host_config(postgres_db.url, "a", tmp_path)) as a, \
            running_host(host_config(postgres_db.url, "b", tmp_path, "scout")) as b:
        await store_items(a.ingest, 1)
        (item,) = await heard_ids(a.store)
        assert await until(lambda: woken(b.store, "scout")) == [item]


async def test_a_lost_notification_delays_the_wake_until_the_poll_but_never_drops_it(
        postgres_db: PostgresDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def deaf(self: Sharing, channel: str, heard: Callable[[str], None]) -> None:
        return None  # nothing LISTENs: every notification is lost

    monkeypatch.setattr(Sharing, "listen", deaf)
    monkeypatch.setattr(follow, "POLL_S", 0.2)
    async with running_host(host_config(postgres_db.url, "a", tmp_path)) as a, \
            running_host(host_config(postgres_db.url, "b", tmp_path, "scout")) as b:
        with capture_logs() as logs:
            await store_items(a.ingest, 2)
            ids = await heard_ids(a.store)
            assert sorted(set(await until(lambda: woken(b.store, "scout")))) == ids
        assert [e for e in logs if e["event"] == "agent.wake"]


async def test_one_host_runs_an_agent_the_other_stands_by_and_takes_it_over_from_its_cursor(
        postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    stop_a = anyio.Event()
    async with open_host(host_config(postgres_db.url, "a", tmp_path, "scout")) as a, \
            anyio.create_task_group() as tg:
        tg.start_soon(a.run, stop_a)
        with anyio.fail_after(30):
            await a.ready.wait()
        await until(lambda: _owns(a, "scout"))
        async with running_host(host_config(postgres_db.url, "b", tmp_path, "scout")) as b:
            status = await b.control.status()
            (scout,) = status.agents
            assert (scout.state, scout.owner) == ("standby", "a")
            assert msgspec.json.decode(msgspec.json.encode(scout))["owner"] == "a"
            assert [(h.name, h.agents) for h in status.hosts] == [("a", ["scout"]), ("b", [])]
            assert check_problems(status, {}) == []  # a standby is healthy
            assert any("standby (a)" in line for line in render_table(status))

            await store_items(b.ingest, 1)  # stored by B, run by A: A's turn
            (first,) = await heard_ids(b.store)
            assert await until(lambda: woken(a.store, "scout")) == [first]

            stop_a.set()  # A stops: its session ends, and the lock with it
            await store_items(b.ingest, 1)  # while nobody, or B already, runs scout
            second = (await heard_ids(b.store))[-1]
            assert await until(lambda: _at_least(woken(b.store, "scout"), 2), timeout=15) == [first, second]
            status = await b.control.status()
            (scout,) = status.agents
            assert scout.state != "standby" and scout.owner is None
            assert "owner" not in msgspec.json.decode(msgspec.json.encode(scout))
            assert [(h.name, h.agents) for h in status.hosts] == [("b", ["scout"])]
            await store_items(b.ingest, 1)  # and B runs it on
            third = (await heard_ids(b.store))[-1]
            assert await until(lambda: _at_least(woken(b.store, "scout"), 3)) == [first, second, third]


async def _owns(host: Host, agent: str) -> bool:
    return host.sharing is not None and agent in host.sharing.agents


async def _runs(host: Host, agent: str) -> bool:
    """`host` owns `agent` and has taken it over (its cursor read, its catch-up done)."""
    return await _owns(host, agent) and agent not in host.agents.standby


async def _at_least(ids: Awaitable[list[int]], count: int) -> list[int] | None:
    found = await ids
    return found if len(found) >= count else None


async def test_two_hosts_flooding_wake_an_agent_on_a_third_for_every_item_once(
        postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    """Every item either host stored is in exactly one of the agent's wakes: by id in its turn's waking items, or
    counted in a wake's overflow past MAX_PENDING_IDS (docs/agents.md#scheduling); none skipped, none twice."""
    per_request, requests = 5, 30
    async with running_host(host_config(postgres_db.url, "a", tmp_path)) as a, \
            running_host(host_config(postgres_db.url, "b", tmp_path)) as b, \
            running_host(host_config(postgres_db.url, "c", tmp_path, "scout", debounce_ms=20,  # no cap holds a wake
                                     max_turns_per_hour=10**6, max_wakes_per_sender_per_hour=10**6)) as c:
        with capture_logs() as logs:
            async def flood(host: Host) -> None:
                for _ in range(requests):
                    await store_items(host.ingest, per_request)

            async with anyio.create_task_group() as tg:
                tg.start_soon(flood, a)
                tg.start_soon(flood, b)
            ids = await heard_ids(c.store)
            assert len(ids) == 2 * per_request * requests

            async def all_woken() -> bool:
                turns = [e for e in logs if e["event"] == "agent.turn" and e["agent"] == "scout"]
                return sum(e["wake"] for e in turns) >= len(ids)

            await until(all_woken, timeout=60)
        by_id = await woken(c.store, "scout")
        assert len(by_id) == len(set(by_id)) and set(by_id) <= set(ids)  # none twice
        overflow = sum(e["wake"] for e in logs if e["event"] == "agent.turn") - len(by_id)
        assert len(by_id) + overflow == len(ids)  # every item in one wake: none skipped
        # The durable cursor passed them all, at the end of the turn that handled the last.
        assert await until(lambda: _cursor_at(c.store, "scout", max(ids)))


async def _cursor_at(store: Store, agent: str, item_id: int) -> bool:
    return (await store.cursors.get(agent) or 0) >= item_id


async def test_a_reload_that_removes_an_agent_frees_it_for_the_standby_and_one_that_adds_it_takes_its_lock(
        postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    a_config = host_config(postgres_db.url, "a", tmp_path, "scout")
    async with running_host(a_config) as a, \
            running_host(host_config(postgres_db.url, "b", tmp_path, "scout")) as b:
        await until(lambda: _owns(a, "scout"))
        assert "scout" in b.agents.standby
        await a.reload(msgspec.structs.replace(a_config, agents=[agent_config("quill", backend=scripted("ok"))]))
        await until(lambda: _runs(b, "scout"))  # A let it go: B took it over
        assert await _runs(a, "quill") and not await _owns(a, "scout")
        await store_items(a.ingest, 1)
        (item,) = await heard_ids(a.store)
        assert await until(lambda: woken(b.store, "scout")) == [item]
        assert await until(lambda: woken(a.store, "quill")) == [item]


async def test_when_the_owners_session_dies_mid_turn_the_standby_closes_that_turn_and_runs_its_wake_again(
        postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    """The server ends A's session (A's machine lost, kill -9) while A's turn hangs: B takes the agent over, closes
    the turn A left open as aborted, and runs its wake again from the durable cursor, which that turn never moved."""
    a_stop = anyio.Event()

    async def run_a(host: Host) -> None:
        try:
            await host.run(a_stop)
        except* StoreError:  # its next heartbeat finds its session gone: it stops (tests/store/test_hosts.py)
            pass

    async with open_host(host_config(postgres_db.url, "a", tmp_path, "scout")) as a, \
            anyio.create_task_group() as tg:
        tg.start_soon(run_a, a)
        await until(lambda: _runs(a, "scout"))
        hanging = HangingBackend()
        a.agents.runners["scout"].state.backend = hanging
        async with running_host(host_config(postgres_db.url, "b", tmp_path, "scout")) as b:
            assert "scout" in b.agents.standby
            await store_items(b.ingest, 1)
            (item,) = await heard_ids(b.store)
            with anyio.fail_after(10):
                await hanging.entered.wait()  # A's turn for it has begun, and hangs
            killer = await asyncpg.connect(postgres_db.url)
            try:
                await killer.execute("SELECT pg_terminate_backend(session_pid::int) FROM hosts WHERE name = 'a'")
            finally:
                await killer.close()
            assert await until(lambda: woken(b.store, "scout"), timeout=20) == [item]
            turns = [turn async for turn in b.store.turns.iterate(agent="scout")]
            assert [(turn.wake_item_ids, turn.outcome) for turn in turns] == [([item], "aborted"),
                                                                             ([item], "completed")]
        a_stop.set()
