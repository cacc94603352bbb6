"""Tests for mcplhost/host.py: the host is built whole before it runs, runs once, and hands its events seam over."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest

from mcplhost.agents.runtime import AgentsRuntime
from mcplhost.config import AgentConfig, BackendConfig
from mcplhost.errors import ConfigError, HostStateError
from mcplhost.host import open_host
from mcplhost.ingest import Ingest, stored_event_stream
from mcplhost.protocol.ports import State
from mcplhost.speech.outbox import OutboxSender
from mcplhost.store import StoreError
from mcplhost.store.writer import GroupWriter
from mcplhost.supervisor.handle import ConnectorHandle

from .harness import config_with, scripted
from .memory_pair import memory_host

SCOUT = AgentConfig(name="scout", backend=BackendConfig(kind="scripted", script=["hi"]))


class TestBuiltWhole:
    async def test_every_part_is_there_before_the_host_runs(self, tmp_path: Path):
        """Store, writer, ingest, one handle and one sender per connector, and the agents: set before run."""
        config = msgspec.structs.replace(config_with(tmp_path, scripted("a", {}, tmp_path),
                                                     scripted("b", {}, tmp_path)), agents=[SCOUT])
        async with open_host(config) as host:
            assert isinstance(host.writer, GroupWriter) and host.writer.store is host.store
            assert isinstance(host.ingest, Ingest) and host.ingest.store is host.store
            assert all(isinstance(h, ConnectorHandle) for h in host.connectors.values())
            assert sorted(host.connectors) == sorted(host.outbox_senders) == ["a", "b"]
            assert all(isinstance(s, OutboxSender) and s.handle is host.connectors[name]
                       for name, s in host.outbox_senders.items())
            assert isinstance(host.agents, AgentsRuntime) and list(host.agents.runners) == ["scout"]
            assert host.agents.store is host.store and host.agents.deps.hooks is host.hooks

    async def test_without_agents_the_runtime_is_empty_and_the_events_stay_free(self, tmp_path: Path):
        """No agent configured: an empty runtime (statistics say so), and a caller may take the Stored events."""
        send, receive = stored_event_stream()
        async with open_host(config_with(tmp_path), events=send) as host:
            assert host.agents.runners == {} and host.agents.statistics() == {}
        with receive, pytest.raises(anyio.EndOfStream):
            await receive.receive()  # never run, yet its consumer is told the stream ended

    async def test_a_host_with_agents_refuses_a_second_consumer_of_its_events(self, tmp_path: Path):
        """The agents consume the Stored events; a caller's `events` as well is refused, its stream closed."""
        send, receive = stored_event_stream()
        config = msgspec.structs.replace(config_with(tmp_path), agents=[SCOUT])
        with pytest.raises(HostStateError, match="one consumer"):
            async with open_host(config, events=send):
                pass
        with receive, pytest.raises(anyio.EndOfStream):
            await receive.receive()

    async def test_a_store_that_cannot_open_fails_the_build_itself(self, tmp_path: Path):
        """A foreign file at the store's path: open_host raises the StoreError (no ExceptionGroup), nothing runs."""
        (tmp_path / "host.db").write_bytes(b"not a database, " * 64)
        with pytest.raises(StoreError):
            async with open_host(config_with(tmp_path)):
                pytest.fail("the host was built over a foreign file")


class TestRun:
    async def test_a_host_runs_once(self, tmp_path: Path):
        """After its stop, running the same host again is refused: its writer and senders are spent."""
        async with memory_host(config_with(tmp_path)) as host:
            pass
        with pytest.raises(HostStateError, match="runs once"):
            await host.run(anyio.Event())


class TestReloadAllOrNothing:
    async def test_a_backend_its_sdk_refuses_leaves_every_connector_and_agent_as_they_run(self, tmp_path: Path):
        """A config check-config could not fault (built here without it) whose agent backend the SDK refuses: the
        reload raises ConfigError naming it, and nothing changed: the changed connector keeps its process, the
        agent its backend and prompt (docs/operations.md#reload)."""
        spec = scripted("a", {"manifest": None}, tmp_path)
        config = msgspec.structs.replace(config_with(tmp_path, spec), agents=[SCOUT])
        async with memory_host(config) as host:
            handle, backend = host.connectors["a"], host.agents.runners["scout"].state.backend
            pid = handle.statistics().pid
            broken = msgspec.structs.replace(SCOUT, system_prompt="new", backend=BackendConfig(
                kind="openai", model="m", base_url="::::"))
            new = msgspec.structs.replace(config, connectors=[msgspec.structs.replace(spec, request_timeout_s=7)],
                                          agents=[broken])
            with pytest.raises(ConfigError) as refused:
                await host.reload(new)
            assert refused.value.problems == ["agents[0].backend: cannot be built: InvalidURL: Relative URLs cannot "
                                              "have a path starting with ':'"]
            assert host.connectors["a"] is handle and handle.statistics().pid == pid and host.config == config
            runner = host.agents.runners["scout"]
            assert runner.agent == SCOUT and runner.state.backend is backend and runner.state.system_prompt == ""

    async def test_a_changed_connector_keeps_its_counts(self, tmp_path: Path):
        """Restarted by a reload, a connector's new handle goes on from the old one's restarts, refusals and times,
        and its sender from the old one's publish counts, as one handle does across restart-connector."""
        spec = scripted("a", {"manifest": None}, tmp_path)
        config = config_with(tmp_path, spec)
        async with memory_host(config) as host:
            old, sender = host.connectors["a"], host.outbox_senders["a"]
            old.refusals.request("nosuch/method", -32601)
            old.published()
            sender.stats["delivered"] += 2
            before = old.statistics()
            await host.reload(msgspec.structs.replace(config, connectors=[msgspec.structs.replace(
                spec, request_timeout_s=7)]))
            new = host.connectors["a"]
            await new.wait_state(State.MCP_ONLY)
            after = new.statistics()
        assert new is not old and after.pid != before.pid and after.restarts == before.restarts + 1
        assert new.refusals.requests == {("nosuch/method", -32601): 1}
        assert after.last_publish_at == before.last_publish_at is not None
        assert host.outbox_senders["a"] is not sender and host.outbox_senders["a"].stats["delivered"] == 2
