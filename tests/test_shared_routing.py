"""What hosts sharing one PostgreSQL store send each other (docs/operations.md#several-hosts-on-one-store): a publish
is sent by its connector's owner, whichever host queued it, and one no live host can send waits, then fails; a
connector's quota counts what every host stored for it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import asyncpg
import structlog

from mcplhost.config import Config, ConnectorConfig, HostConfig, StoreConfig
from mcplhost.host import Host
from mcplhost.ingest import Ingest
from mcplhost.ingest.quotas import QuotaLimits
from mcplhost.speech.echoes import EchoMemory
from mcplhost.speech.outbox import DEFAULT_MAX_AGE_S, TOO_OLD
from mcplhost.speech.shared import expire_unowned
from mcplhost.store import open_store
from mcplhost.store.hosts import HostIdentity, Sharing
from mcplhost.store.operations import PublishSpeech
from mcplhost.store.outbox import PUBLISH_CHANNEL
from mcplhost.store.writer import GroupWriter

from .harness import scripted, wait_for
from .memory_pair import memory_host
from .postgres import PostgresDatabase
from .speech.test_outbox import DELIVERED, GRANT, MANIFEST, REGISTER, ended, publish_entry, publishes
from .test_ingest_quotas import Clock, accepted, send


def chat(folder: Path) -> ConnectorConfig:
    """Connector `chat`: registers `room` and delivers every publish, recording to folder/chat.jsonl."""
    return scripted("chat", {"manifest": MANIFEST, "handlers": {"channels/publish": DELIVERED}, "steps": [REGISTER]},
                    folder, grant=GRANT)


def host_config(url: str, name: str, folder: Path, *connectors: ConnectorConfig) -> Config:
    return Config(store=StoreConfig(url=url, state_dir=str(folder)), host=HostConfig(name=name),
                  connectors=list(connectors))


def state(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return folder


async def queue_on(host: Host, text: str, *, server: str = "chat", created_at: int | None = None) -> int:
    """Queue one publish on `host` as a turn does: PublishSpeech, then its own sender's notify() (if it has one)."""
    speech, entry = publish_entry(text, server=server, created_at=created_at)
    published = await host.writer.write(PublishSpeech(speech, [entry]))
    if server in host.outbox_senders:
        host.outbox_senders[server].notify()
    return published.outbox_ids[0]


@asynccontextmanager
async def shared_ingest(url: str, clock: Clock, **limits: int) -> AsyncIterator[Ingest]:
    """One host's Ingest over the shared store at `url`, with `disc`'s quotas (tests/test_ingest_quotas.py's)."""
    async with open_store(url) as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        yield Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox), clock_ms=clock,
                     quotas={"disc": QuotaLimits(**limits)})
        tg.cancel_scope.cancel()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def test_a_commit_that_queues_publishes_names_their_connector_to_every_listener(
        postgres_db: PostgresDatabase) -> None:
    heard: list[str] = []
    named = anyio.Event()

    def hear(payload: str) -> None:
        heard.append(payload)
        named.set()

    async with open_store(postgres_db.url) as store, store.session() as session:
        await session.listen(PUBLISH_CHANNEL, hear)
        async with store.transaction():
            speech, entry = publish_entry("hi", server="chat")
            await store.outbox.insert_many_nocommit([entry, entry])
            _, other = publish_entry("hi", server="other")
            await store.outbox.insert_many_nocommit([other])
        with anyio.fail_after(10):
            await named.wait()
            while len(heard) < 2:
                await anyio.sleep(0.01)
    assert sorted(heard) == ["chat", "other"]  # once per connector and commit


async def test_a_publish_queued_on_the_standby_host_is_sent_by_the_owner_only(
        postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    a_folder, b_folder = state(tmp_path, "a"), state(tmp_path, "b")
    async with memory_host(host_config(postgres_db.url, "a", a_folder, chat(a_folder))) as a:
        await wait_for(lambda: "chat" in a.sharing.owned if a.sharing is not None else False)
        async with memory_host(host_config(postgres_db.url, "b", b_folder, chat(b_folder))) as b:
            assert b.sharing is not None and b.sharing.is_standby("chat")
            outbox_id = await queue_on(b, "from b")
            row = await ended(b.store, outbox_id)
            assert row.state == "delivered" and row.attempts == 1
            assert (a.outbox_senders["chat"].stats["delivered"], b.outbox_senders["chat"].stats["delivered"]) == (1, 0)
            assert await b.store.outbox.pending_by_agent() == {}  # what B's status shows as outboxPending
    assert [m["params"]["content"][0]["text"] for m in publishes(a_folder, "chat")] == ["from b"]
    assert publishes(b_folder, "chat") == []  # B never ran the connector, nor sent on it


async def test_a_publish_queued_on_a_host_without_the_connector_is_sent_by_its_owner(
        postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    a_folder, b_folder = state(tmp_path, "a"), state(tmp_path, "b")
    async with memory_host(host_config(postgres_db.url, "a", a_folder, chat(a_folder))) as a, \
            memory_host(host_config(postgres_db.url, "b", b_folder)) as b:
        assert "chat" not in b.outbox_senders
        outbox_id = await queue_on(b, "from b")  # nothing on B notifies A's sender but the store's notification
        assert (await ended(b.store, outbox_id)).state == "delivered"
        assert a.outbox_senders["chat"].stats["delivered"] == 1
    assert len(publishes(a_folder, "chat")) == 1


async def test_a_publish_whose_connector_no_live_host_owns_waits_then_fails_after_its_max_age(
        postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    a_folder, b_folder = state(tmp_path, "a"), state(tmp_path, "b")
    async with memory_host(host_config(postgres_db.url, "a", a_folder, chat(a_folder))) as a, \
            memory_host(host_config(postgres_db.url, "b", b_folder)) as b:
        old = now_ms() - round(DEFAULT_MAX_AGE_S * 1000) - 1000
        young = await queue_on(b, "nobody sends this yet", server="gone")
        owned_old = await queue_on(b, "chat's owner decides", server="chat", created_at=old)
        assert (await ended(b.store, owned_old)).state == "failed"  # its owner's sender failed it, not the look
        assert await expire_unowned(b.store, b.writer, b._owned_anywhere, {}) == 0
        assert (await b.store.outbox.get(young)).state == "pending"  # it waits: a host may yet run `gone`

        stale = await queue_on(b, "waited too long", server="gone", created_at=old)
        assert await expire_unowned(b.store, b.writer, a._owned_anywhere, {}) == 1  # any host's look fails it
        assert await expire_unowned(b.store, b.writer, b._owned_anywhere, {}) == 0  # once
        row = await b.store.outbox.get(stale)
        assert (row.state, row.attempts, row.last_error) == ("failed", 0, TOO_OLD)
        assert (await b.store.outbox.get(young)).state == "pending"
        notices = [item for item in await b.store.items.list() if item.metadata.get("kind") == "failed-reply"]
        assert [n.metadata["outboxId"] for n in notices] == [owned_old, stale]  # one notice each, for the agent



async def test_a_host_holds_a_connector_only_while_its_session_is_open(postgres_db: PostgresDatabase) -> None:
    """`holds` asks the server: once it ended the session, the lock is gone and the sender must not send."""
    async with open_store(postgres_db.url) as store, store.session() as session:
        ((pid,),) = await session.fetch("SELECT pg_backend_pid()")
        sharing = Sharing(session, HostIdentity(name="a", pid=1, version="9.9", started_at=1))
        assert await sharing.try_own("chat")
        assert await sharing.holds("chat") and not await sharing.holds("other")
        admin = await asyncpg.connect(postgres_db.url)  # not `session`: the one the server ends
        try:
            await admin.execute("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()
        assert not await sharing.holds("chat")


async def test_a_connectors_quota_counts_what_every_host_stored_for_it(postgres_db: PostgresDatabase) -> None:
    """max_items_per_hour = 3: host A stores two, B (taking the connector over) one of two, and A, taking it back
    (reseeded, as host.py does at each take-over), none: one budget in the store, whichever host counts."""
    clock = Clock()
    async with shared_ingest(postgres_db.url, clock, max_items=3) as a, \
            shared_ingest(postgres_db.url, clock, max_items=3) as b:
        assert accepted(await send(a, "m-1", "m-2")) == [True, True]
        assert accepted(await send(b, "m-3", "m-4")) == [True, False]  # B never heard of disc: seeded from the store
        a.reseed_quota("disc")
        assert accepted(await send(a, "m-5")) == [False]
        assert b.quota_statistics()["disc"]["items"] == 3
