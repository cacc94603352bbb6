"""The connector handle inside a real Host: one object across crashes and restarts.

A crash and its restart run over real connector subprocesses (a real pid that dies); the calls, statistics and
grant warnings run over the in-memory pair (tests/memory_pair.py), the same session and connection with no process.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from mcplhost.config import ConnectorConfig, RestartConfig
from mcplhost.host import open_host
from mcplhost.rpc import RemoteError
from mcplhost.supervisor.handle import ConnectorGone, ConnectorNotReady, ConnectorStopped, State

from ..harness import CHAT_GRANT, CHAT_MANIFEST, alive, config_with, record, running_host, scripted, wait_for
from ..memory_pair import memory_host
from .support import chat_steps, events

#: Long enough to look at the backoff state, short enough for a quick test.
SLOW_RESTART = RestartConfig(policy="always", backoff_initial_s=1.0, backoff_max_s=1.0, burst=100, window_s=30)
#: Handlers the scripted connectors answer: a host request that gets a result.
PONG = {"test/ping": {"result": {"pong": True}}}
#: How long any awaited state may take on a busy machine.
WAIT_S = 15


def phoenix(tmp_path: Path) -> ConnectorConfig:
    """A chat connector that exits with code 3 whenever the host sends it test/crash."""
    script = {"manifest": CHAT_MANIFEST, "handlers": PONG, "steps": [{"wait": "test/crash"}, {"exit": 3}]}
    return scripted("phoenix", script, tmp_path, grant=CHAT_GRANT, restart=SLOW_RESTART,
                    stop_grace_s=0.5, term_grace_s=0.5)


class TestAcrossRestarts:
    async def test_one_handle_follows_a_crash_a_backoff_and_a_restart(self, tmp_path, logs) -> None:
        """ready → backoff (calls refused, pid None, the exit as last error) → ready again, same object."""
        async with running_host(config_with(tmp_path, phoenix(tmp_path))) as host:
            handle = host.connectors["phoenix"]
            with anyio.fail_after(WAIT_S):
                await handle.wait_ready()
            first = handle.statistics()
            assert (first.state, first.restarts, first.last_error) == (State.READY, 0, None)
            assert first.pid is not None and alive(first.pid)
            assert await handle.request("test/ping", {}) == {"pong": True}

            await handle.notify("test/crash", {})
            with anyio.fail_after(WAIT_S):
                await handle.wait_state(State.BACKOFF)
            await wait_for(lambda: handle.statistics().pid is None)  # the shutdown ladder runs in backoff
            between = handle.statistics()
            assert (between.state, between.restarts) == (State.BACKOFF, 0)
            assert between.last_error == "the process exited with code 3"
            assert between.grant == frozenset() and between.channels == 0
            with pytest.raises(ConnectorNotReady, match="backoff"):
                await handle.request("test/ping", {})

            with anyio.fail_after(WAIT_S):
                await handle.wait_ready()
            assert host.connectors["phoenix"] is handle
            again = handle.statistics()
            assert again.restarts == 1 and again.pid not in (None, first.pid)
            assert await handle.request("test/ping", {}) == {"pong": True}
        states = [e["state"] for e in logs if e.get("connector") == "phoenix" and "previous" in e]
        assert states == ["handshaking", "policy_pending", "ready", "backoff",
                          "starting", "handshaking", "policy_pending", "ready", "stopped"]

    async def test_the_host_has_a_handle_per_connector_before_it_runs(self, tmp_path) -> None:
        """Host.connectors is complete from the start; each handle reads starting until its connector runs."""
        async with open_host(config_with(tmp_path, phoenix(tmp_path), scripted("other", {}, tmp_path))) as host:
            assert sorted(host.connectors) == ["other", "phoenix"]
            assert all(h.state is State.STARTING and h.statistics().pid is None for h in host.connectors.values())


class TestCalls:
    async def test_a_request_waiting_when_the_life_ends_gets_connector_gone(self, tmp_path) -> None:
        """A request the connector never answers, cut off by its exit, raises ConnectorGone at once, not a timeout."""
        script = {"manifest": CHAT_MANIFEST, "handlers": {"test/hang": "ignore"},
                  "steps": [{"wait": "test/hang"}, {"exit": 3}]}
        spec = scripted("quitter", script, tmp_path, grant=CHAT_GRANT)
        async with memory_host(config_with(tmp_path, spec)) as host:
            handle = host.connectors["quitter"]
            began = time.monotonic()
            with anyio.fail_after(WAIT_S), pytest.raises(ConnectorGone):
                await handle.request("test/hang", {}, timeout=60)
            assert time.monotonic() - began < WAIT_S
            with anyio.fail_after(WAIT_S), pytest.raises(ConnectorStopped):
                await handle.wait_ready()  # policy never: it will not come back
            assert handle.state is State.STOPPED

    async def test_an_error_answer_comes_back_as_the_remote_error(self, tmp_path) -> None:
        """The connector's own error object reaches the caller as RemoteError, and the handle stays ready."""
        spec = scripted("picky", {"manifest": CHAT_MANIFEST, "steps": [{"wait": "never"}]}, tmp_path,
                        grant=CHAT_GRANT)
        async with memory_host(config_with(tmp_path, spec)) as host:
            handle = host.connectors["picky"]
            with pytest.raises(RemoteError) as caught:
                await handle.request("no/such/method", {})
            assert caught.value.code == -32601 and handle.state is State.READY

    async def test_a_plain_mcp_connector_serves_mcp_calls(self, tmp_path) -> None:
        """Without a manifest the handle reads mcp_only, grants nothing, and still carries requests."""
        spec = scripted("plain", {"manifest": None, "handlers": PONG, "steps": [{"wait": "never"}]}, tmp_path)
        async with memory_host(config_with(tmp_path, spec)) as host:
            handle = host.connectors["plain"]
            assert handle.state is State.MCP_ONLY and handle.grant == frozenset()
            assert await handle.request("test/ping", {}) == {"pong": True}


class TestStatistics:
    async def test_channels_grant_and_last_inbound_time(self, tmp_path) -> None:
        """After messages arrive, statistics() shows the channel, the grant and when the last one came in."""
        spec = scripted("disc", {"manifest": CHAT_MANIFEST, "steps": [*chat_steps("disc", 2), {"wait": "never"}]},
                        tmp_path, grant=CHAT_GRANT)
        before = int(time.time() * 1000)
        async with memory_host(config_with(tmp_path, spec)) as host:
            handle = host.connectors["disc"]
            await wait_for(lambda: len(record(tmp_path, "disc").answers()) >= 3)  # register and two messages
            stats = handle.statistics()
            after = int(time.time() * 1000)
            assert stats.last_inbound_at is not None and before <= stats.last_inbound_at <= after
            assert stats.channels == 1 and handle.channel("disc:g1:room") is not None
            assert [c.id for c in handle.channels()] == ["disc:g1:room"]
            assert "channels.incoming" in stats.grant and stats.grant == handle.grant


class TestEmptyGrant:
    async def test_an_empty_grant_is_warned_about_once_not_at_every_restart(self, tmp_path, logs) -> None:
        """A crash-looping connector without a grant gets one connector.grant_empty warning; one with a grant none."""
        looping = RestartConfig(policy="always", backoff_initial_s=0.05, backoff_max_s=0.1, burst=100, window_s=5)
        bare = scripted("bare", {"after": "start", "steps": [{"exit": 1}]}, tmp_path, restart=looping)
        granted = scripted("granted", {"manifest": CHAT_MANIFEST, "steps": [{"wait": "never"}]}, tmp_path,
                           grant=CHAT_GRANT)
        async with memory_host(config_with(tmp_path, bare, granted)) as host:
            await wait_for(lambda: host.connectors["bare"].statistics().restarts >= 3)
        (warning,) = events(logs, "connector.grant_empty")
        assert warning["connector"] == "bare" and warning["log_level"] == "warning"
        assert "nothing this connector sends can be accepted" in warning["detail"]
