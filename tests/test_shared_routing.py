"""What hosts sharing one PostgreSQL store send each other (docs/operations.md#several-hosts-on-one-store): a publish
is sent by its connector's owner, whichever host queued it, and one no live host can send waits, then fails; a
connector's quota counts what every host stored for it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
import asyncpg
import msgspec
import structlog

from mcplhost.config import Config, ConnectorConfig, HostConfig, StoreConfig
from mcplhost.host import Host
from mcplhost.ingest import Ingest
from mcplhost.ingest.quotas import QuotaLimits
from mcplhost.peers.limits import PAIR_MAX, TARGET_MAX
from mcplhost.peers.service import PeerService
from mcplhost.speech.echoes import EchoMemory
from mcplhost.speech.outbox import DEFAULT_MAX_AGE_S, TOO_OLD
from mcplhost.speech.shared import expire_unowned, serve_shared_outbox
from mcplhost.store import Store, Stored, open_store
from mcplhost.store.hosts import HostIdentity, Sharing
from mcplhost.store.operations import PublishSpeech
from mcplhost.store.outbox import PUBLISH_CHANNEL
from mcplhost.store.peers import PEER_CHANNEL
from mcplhost.store.writer import GroupWriter

from .agents.support import agent_config
from .agents.support import scripted as scripted_backend
from .builders import incoming, message
from .harness import scripted, wait_for
from .memory_pair import memory_host
from .peers.test_service import AGENTS as PEER_AGENTS
from .peers.test_service import Agents
from .peers.test_service import Clock as PeerClock
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
            # The sender counts once its commit returns, which may be after `ended` read the row.
            await wait_for(lambda: a.outbox_senders["chat"].stats["delivered"] == 1)
            assert b.outbox_senders["chat"].stats == {"delivered": 0, "failed": 0, "retried": 0, "crashed": 0}
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
        await wait_for(lambda: a.outbox_senders["chat"].stats["delivered"] == 1)
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
        assert await expire_unowned(b.store, b.writer, b.owned_anywhere, {}) == 0
        assert (await b.store.outbox.get(young)).state == "pending"  # it waits: a host may yet run `gone`

        stale = await queue_on(b, "waited too long", server="gone", created_at=old)
        assert await expire_unowned(b.store, b.writer, a.owned_anywhere, {}) == 1  # any host's look fails it
        assert await expire_unowned(b.store, b.writer, b.owned_anywhere, {}) == 0  # once
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


@asynccontextmanager
async def shared_peers(url: str, agents: Agents, clock: PeerClock, *, runs: set[str],
                       wakes: list[Stored] | None = None) -> AsyncIterator[tuple[PeerService, Store]]:
    """One host's peer service on the shared store at `url`, running the agents in `runs`; with `wakes`, it delivers
    what other hosts queue for them (told by the store's notification only: its own look waits a minute)."""
    async with open_store(url) as store, store.session() as session, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        service = PeerService(PEER_AGENTS, store, writer, activity=agents, clock_ms=clock, shared=True,
                              is_local_agent=runs.__contains__)
        await service.start()
        if wakes is not None:
            await session.listen(PEER_CHANNEL, service.heard)
            tg.start_soon(partial(service.deliver_shared, wakes.append, poll_s=60))
        yield service, store
        tg.cancel_scope.cancel()


async def test_a_peer_message_to_an_agent_the_other_host_runs_is_delivered_there_once(
        postgres_db: PostgresDatabase) -> None:
    """B's scout writes to writer, which A runs: B cannot know whether writer is idle, so it queues; A, told by
    the store, delivers the one entry as writer's row and wakes it; B delivers nothing."""
    clock, a_wakes, b_wakes = PeerClock(), [], []
    async with shared_peers(postgres_db.url, Agents(), clock, runs={"writer", "lead"}, wakes=a_wakes) as (_, store), \
            shared_peers(postgres_db.url, Agents(), clock, runs={"scout"}, wakes=b_wakes) as (b, _):
        assert (await b.send("scout", "writer", "found it", None)).answer == {"status": "queued", "target": "writer"}
        await wait_for(lambda: a_wakes, timeout=10)
        (entry,) = [row async for row in store.peers.iterate(target="writer")]
        assert entry.state == "delivered" and [w.id for w in a_wakes] == [entry.item_id]
        (row,) = [item for item in await store.items.list(agent="writer") if "peer" in item.metadata]
        assert row.participant == "scout" and "found it" in row.content[0]["text"]
        assert b_wakes == [] and await b.deliver_queued("scout") == []


async def test_a_throttle_holds_across_two_hosts(postgres_db: PostgresDatabase) -> None:
    """The target limit (TARGET_MAX sends a minute, all senders) counts the sends admitted on both hosts, and the
    pair limit one sender's sends wherever its target runs."""
    clock, agents = PeerClock(), Agents()
    half = TARGET_MAX // 2
    async with shared_peers(postgres_db.url, agents, clock, runs={f"kid{n}" for n in range(half)}) as (a, _), \
            shared_peers(postgres_db.url, agents, clock, runs={f"kid{n}" for n in range(half, TARGET_MAX + 1)}) as (b, _):
        for n in range(TARGET_MAX):
            answer = (await (a if n < half else b).send(f"kid{n}", "writer", f"hi {n}", None)).answer
            assert answer["status"] == "queued"  # writer runs on neither host here
        refused = (await b.send(f"kid{TARGET_MAX}", "writer", "one more", None)).answer
        assert refused["status"] == "rate_limited"
        assert (await a.send("kid0", "scout", "elsewhere", None)).answer["status"] == "queued"  # another target's window
        for n in range(PAIR_MAX - 1):
            assert (await a.send("kid1", "scout", f"m{n}", None)).answer["status"] == "queued"
        assert (await a.send("kid1", "scout", "past the pair limit", None)).answer["status"] == "queued"
        assert (await b.send("kid1", "scout", "from b too", None)).answer["status"] == "rate_limited"


class Noted:
    """A sender as the host's look at the queue sees it: `notify()` recorded."""

    def __init__(self) -> None:
        self.woken = anyio.Event()

    def notify(self) -> None:
        self.woken.set()


async def test_a_lost_notification_only_delays_a_publish_until_the_hosts_next_look(
        postgres_db: PostgresDatabase) -> None:
    """Nothing LISTENs (every notification lost): the host's look at the pending rows still wakes the sender of
    the connector they wait for, and no other."""
    async def deaf(channel: str, heard: Callable[[str], None]) -> None:
        return None

    async def nobody() -> set[str]:
        return set()

    chat, other = Noted(), Noted()
    async with open_store(postgres_db.url) as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        await tg.start(partial(serve_shared_outbox, deaf, {"chat": chat, "other": other}, store, writer, nobody, {},
                               poll_s=0.05))
        speech, entry = publish_entry("lost notification", server="chat")
        await writer.write(PublishSpeech(speech, [entry]))
        with anyio.fail_after(10):
            await chat.woken.wait()
        assert not other.woken.is_set()  # decided in the same look that woke chat's
        tg.cancel_scope.cancel()


async def test_an_agent_on_one_host_replies_through_the_connector_another_host_runs(
        postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    """A message through A's connector wakes scout, which B runs (B has no connector); scout's reply goes to the
    wake's conversation on A's connector, and A sends it."""
    a_folder, b_folder = state(tmp_path, "a"), state(tmp_path, "b")
    manifest = {"version": "0.5", "channels": {"register": True, "incoming": True, "publish": True},
                "featureSets": {"chat": {"description": "chat",
                                         "uses": ["channels.register", "channels.incoming", "channels.publish"]}}}
    chatting = scripted("chat", {"manifest": manifest, "handlers": {"channels/publish": DELIVERED},
                                 "steps": [REGISTER, incoming(message("room", body="anyone there?"))]},
                        a_folder, grant=["channels.register", "channels.incoming", "channels.publish"])
    b_config = msgspec.structs.replace(host_config(postgres_db.url, "b", b_folder),
                                       agents=[agent_config("scout", backend=scripted_backend("hello from b"))])
    # B first: a new agent's cursor starts at the store's end, so A's message must come after it.
    async with memory_host(b_config) as b, memory_host(host_config(postgres_db.url, "a", a_folder, chatting)) as a:
        assert "chat" not in b.connectors and "chat" in a.connectors
        await wait_for(lambda: publishes(a_folder, "chat"), timeout=30)
        (sent,) = publishes(a_folder, "chat")
        assert sent["params"]["channelId"] == "room" and sent["params"]["content"][0]["text"] == "hello from b"
        (row,) = await b.store.outbox.list()
        assert (row.agent, row.server_id) == ("scout", "chat")
        assert (await ended(b.store, row.id)).state == "delivered"
        await wait_for(lambda: a.outbox_senders["chat"].stats["delivered"] == 1)
