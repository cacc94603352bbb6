"""What the daemon answers (mcplhost/control/responder.py) over a real store: the store's counts per agent."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from mcplhost.agents.turns.agent_rows import draft_row, speech_row
from mcplhost.agents.wiring import build_agents
from mcplhost.config import Config
from mcplhost.control.responder import ControlService
from mcplhost.control.status import HostEntry, Status
from mcplhost.control.wire import RestartRequest, StatusRequest
from mcplhost.store import TurnStart
from mcplhost.store.migrate import load_migrations
from mcplhost.store.outbox import OutboxEntry

from ..agents.support import agent_config, agent_store, scripted


def publish(agent: str, turn: int) -> OutboxEntry:
    return OutboxEntry(agent=agent, turn_id=turn, server_id="disc", channel_id="disc:g1:room", thread_id=None,
                       conversation_id="c-1", text="hi", created_at=1_000)


class TestAnswers:
    async def test_status_counts_drafts_of_the_newest_turn_and_pending_publishes(self, tmp_path: Path):
        """drafts: the newest turn's draft rows only; outboxPending: the agent's pending rows; schema and size."""
        config = Config(agents=[agent_config("scout", backend=scripted("x")), agent_config("quill",
                                                                                          backend=scripted("y"))])
        async with agent_store(tmp_path) as (store, writer, _):
            async with store.transaction():
                old, new = await store.turns.begin_many_nocommit([TurnStart("scout", (), 1_000),
                                                                  TurnStart("scout", (), 2_000)])
                await store.items.insert_many_nocommit([
                    draft_row("scout", old, "old draft", "several conversations", created_at=1_000),
                    draft_row("scout", new, "first", "several conversations", created_at=2_000),
                    speech_row("scout", new, "said", created_at=2_001),
                    draft_row("scout", new, "second", "several conversations", created_at=2_002)])
                await store.outbox.insert_many_nocommit([publish("scout", new), publish("scout", new),
                                                         publish("quill", 0)])
            runtime = build_agents(config, store, writer, {})
            service = ControlService(store, {}, runtime, started_at_ms=123, host_name="eu-1")
            answer = await service.answer(StatusRequest())
            assert answer.ok and answer.problems == []
            status = msgspec.json.decode(bytes(answer.status), type=Status)  # type: ignore[arg-type]
            counts = {a.name: (a.drafts, a.outbox_pending, a.queued_peer_messages) for a in status.agents}
            assert counts == {"scout": (2, 2, 0), "quill": (0, 1, 0)}
            assert status.host.pid == os.getpid() and status.host.started_at == 123
            assert status.host.schema_version == len(load_migrations())
            assert status.host.db == str((tmp_path / "host.db").resolve())
            db, wal = tmp_path / "host.db", tmp_path / "host.db-wal"
            assert status.host.db_bytes == db.stat().st_size + (wal.stat().st_size if wal.exists() else 0) > 0
            assert status.hosts == [HostEntry(name="eu-1", pid=os.getpid(), version=status.host.version,
                                              started_at=123, heartbeat_age_ms=0, connectors=[],
                                              agents=["scout", "quill"])]

    async def test_restarting_a_connector_not_configured_names_those_that_are(self, tmp_path: Path):
        """An unknown name is refused with the configured names."""
        async with agent_store(tmp_path) as (store, writer, _):
            service = ControlService(store, {}, build_agents(Config(), store, writer, {}), started_at_ms=0)
            answer = await service.answer(RestartRequest(name="disc"))
            assert not answer.ok and answer.error == "no connector is named 'disc' (configured: none)"
