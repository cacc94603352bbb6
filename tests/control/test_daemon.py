"""Status, --check and restart-connector over the real control socket of a real `mcplhost run`.

docs/operations.md#status-and-the-control-socket: one daemon holds a connector in each state
(ready, mcp_only, backoff, slow_lane, stopped under policy never) and an agent that has had a turn;
a second, healthy one checks exit 0, the socket's replacement when stale and its removal on exit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
from pathlib import Path
from typing import Any

import mcplhost
from mcplhost.config import default_host_name
from mcplhost.store.migrate import load_migrations

from ..cli.support import NotifySocket, cli, daemon, scripted_connector, write_config
from ..e2e.test_agents import with_agents
from ..harness import CHAT_MANIFEST, alive, http_exchange, wait_for

ROOM, OTHER = "disc:g1:room", "disc:g1:other"
GRANT = ["channels.register", "channels.incoming", "channels.publish", "pushEvents"]
REGISTER = {"request": "channels/register", "params": {"channels": [
    {"id": channel, "type": "disc", "direction": "bidirectional", "address": {}, "label": label}
    for channel, label in ((ROOM, "#room"), (OTHER, "#other"))]}}
ADDRESSED = {"request": "channels/incoming", "params": {"messages": [
    {"channelId": ROOM, "messageId": "m-1", "author": {"id": "u-alice", "name": "Alice"},
     "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": "scout, hello"}],
     "tags": ["chat:addressed"]}]}}
DELIVERED = {"result": {"delivered": True, "messageId": "sent-1"}}
#: A start that fails at once: the process exits when asked to initialize.
FAILS = {"initialize": "exit"}

HOST_KEYS = {"pid", "version", "startedAt", "schemaVersion", "db", "dbBytes"}
CONNECTOR_KEYS = {"name", "state", "pid", "restarts", "lastError", "lastInboundAt", "lastPublishAt", "channels",
                  "grant", "quiet"}
AGENT_KEYS = {"name", "state", "pendingWakes", "queuedPeerMessages", "drafts", "outboxPending", "turnsLastHour",
              "held", "lastError", "failedTurnsLastHour"}


def every_state_config(tmp_path: Path) -> Path:
    """One connector per state, and scout, who answers the addressed message in #room."""
    connectors = [
        scripted_connector("up", {"manifest": CHAT_MANIFEST, "steps": [REGISTER, ADDRESSED],
                                  "handlers": {"channels/publish": DELIVERED}}, tmp_path, grant=GRANT),
        scripted_connector("plain", {"manifest": None}, tmp_path),
        scripted_connector("flaky", FAILS, tmp_path, restart={"backoff_initial_s": 30, "backoff_max_s": 60}),
        scripted_connector("looping", FAILS, tmp_path, restart={"backoff_initial_s": 0.01, "backoff_max_s": 60,
                                                                "burst": 2, "window_s": 60}),
        scripted_connector("once", FAILS, tmp_path, restart={"policy": "never"}),
    ]
    return with_agents(write_config(tmp_path, connectors),
                       ({"name": "scout", "wake_on": ["addressed"], "debounce_ms": 20},
                        {"kind": "scripted", "script": ["hi"]}))


def status(config: Path, *extra: str) -> Any:
    result = cli("status", "--config", str(config), *extra)
    assert result.returncode in (0, 1) and result.stderr == "", result
    return result


def status_object(config: Path) -> dict[str, Any]:
    return json.loads(status(config, "--json").stdout)


def by_name(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in entries}


def spawned_pids(run: Any, name: str) -> list[int]:
    return [event["pid"] for event in run.events("connector.spawned", connector=name)]


class TestEveryState:
    async def test_status_check_table_socket_and_restart_connector(self, tmp_path: Path):
        """Each state as status reports it, the exact keys, --check's one problem, the 0600 socket, STATUS=,
        and restart-connector: a new pid and a fresh budget for one, the others' pids unchanged."""
        config = every_state_config(tmp_path)
        db = tmp_path / "host.db"
        with NotifySocket.abstract() as notify:
            async with daemon(config, tmp_path, env={"NOTIFY_SOCKET": notify.address}) as run:
                await run.wait_event("host.ready")
                await run.wait_event("connector.slow_lane", connector="looping")
                await run.wait_event("connector.stopped", connector="once")
                await run.wait_event("connector.restart_scheduled", connector="flaky")
                await run.wait_event("outbox.delivered", connector="up", timeout=30)
                await run.wait_event("agent.turn", agent="scout")
                # systemd hears the counts by state once they settle (rate-limited, not per change).
                await notify.wait("STATUS=5 connectors: 1 ready, 1 mcp_only, 1 backoff, 1 slow_lane, 1 stopped")

                socket_path = tmp_path / "mcplhost.sock"  # the default: beside the database
                mode = os.stat(socket_path).st_mode
                assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600

                whole = status_object(config)
                assert set(whole) == {"host", "connectors", "agents", "hosts"}
                assert set(whole["host"]) == HOST_KEYS
                assert all(set(c) == CONNECTOR_KEYS for c in whole["connectors"])
                assert all(set(a) == AGENT_KEYS for a in whole["agents"])

                host = whole["host"]
                assert host["pid"] == run.pid and host["version"] == mcplhost.__version__
                # On SQLite the store is this host's alone: `hosts` is itself, owning everything it runs.
                assert whole["hosts"] == [{"name": default_host_name(), "pid": run.pid, "version": host["version"],
                                           "startedAt": host["startedAt"], "heartbeatAgeMs": 0,
                                           "connectors": ["up", "plain", "flaky", "looping", "once"],
                                           "agents": ["scout"]}]
                assert host["db"] == str(db.resolve()) and host["schemaVersion"] == len(load_migrations())
                wal = db.with_name(db.name + "-wal")  # the host is idle now: nothing grows either file
                assert host["dbBytes"] == db.stat().st_size + (wal.stat().st_size if wal.exists() else 0) > 0

                connectors = by_name(whole["connectors"])
                assert [c["name"] for c in whole["connectors"]] == ["up", "plain", "flaky", "looping", "once"]
                up = connectors["up"]
                assert up["state"] == "ready" and alive(up["pid"]) and up["restarts"] == 0
                assert up["channels"] == 2 and up["grant"] == sorted(GRANT) and up["quiet"] is False
                assert up["lastInboundAt"] is not None and up["lastPublishAt"] is not None
                assert up["lastError"] is None
                assert connectors["plain"]["state"] == "mcp_only" and alive(connectors["plain"]["pid"])
                assert connectors["plain"]["grant"] == [] and connectors["plain"]["lastPublishAt"] is None
                flaky = connectors["flaky"]
                assert flaky["state"] == "backoff" and flaky["pid"] is None and flaky["restarts"] == 0
                assert "initialize" in flaky["lastError"]
                looping = connectors["looping"]
                assert looping["state"] == "slow_lane" and looping["restarts"] == 1 and looping["pid"] is None
                once = connectors["once"]
                assert once["state"] == "stopped" and once["pid"] is None and once["lastError"]

                (scout,) = whole["agents"]
                assert scout == {"name": "scout", "state": "idle", "pendingWakes": 0, "queuedPeerMessages": 0,
                                 "drafts": 0, "outboxPending": 0, "turnsLastHour": 1, "held": False,
                                 "lastError": None, "failedTurnsLastHour": 0}

                # --check: only the crash loop is a problem (backoff is fine, stopped under policy never is too).
                check = cli("status", "--config", str(config), "--check")
                assert check.returncode == 1 and check.stderr == ""
                (problem,) = check.stdout.splitlines()
                assert problem.startswith("looping: slow_lane")

                table = status(config).stdout.splitlines()
                assert table[0].startswith(f"mcplhost {mcplhost.__version__}  pid {run.pid}")
                header = next(line for line in table if line.startswith("CONNECTOR"))
                assert header.split() == ["CONNECTOR", "STATE", "PID", "RESTARTS", "INBOUND", "PUBLISH", "CHANNELS",
                                          "QUIET", "GRANT", "LAST", "ERROR"]
                rows = {line.split()[0]: line.split() for line in table if line.split()[:1] and
                        line.split()[0] in connectors}
                assert rows["up"][1:3] == ["ready", str(up["pid"])] and rows["looping"][1] == "slow_lane"
                assert any(line.split()[:2] == ["scout", "idle"] for line in table)

                # restart-connector: a serving connector gets a new life (new pid); nobody else is touched.
                before = {name: connectors[name]["pid"] for name in ("up", "plain")}
                restarted = cli("restart-connector", "up", "--config", str(config))
                assert restarted.returncode == 0 and restarted.stdout.startswith("up: restarting"), restarted
                await wait_for(lambda: len(spawned_pids(run, "up")) == 2)
                await wait_for(lambda: by_name(status_object(config)["connectors"])["up"]["state"] == "ready")
                after = by_name(status_object(config)["connectors"])
                assert after["up"]["pid"] not in (None, before["up"]) and after["up"]["pid"] == spawned_pids(run, "up")[1]
                assert after["up"]["restarts"] == 1 and after["plain"]["pid"] == before["plain"]

                # ... and a crash loop's budget starts afresh: its next failure is the first again, not the slow lane.
                first_failures = len(run.events("connector.restart_scheduled", connector="looping", failures=1))
                assert cli("restart-connector", "looping", "--config", str(config)).returncode == 0
                await wait_for(lambda: len(run.events("connector.restart_scheduled", connector="looping",
                                                      failures=1)) == first_failures + 1)
                assert by_name(status_object(config)["connectors"])["up"]["pid"] == after["up"]["pid"]

                # Refusals: a connector stopped for good, a name not configured (exit 1, one line).
                once_restart = cli("restart-connector", "once", "--config", str(config))
                assert once_restart.returncode == 1 and "stopped for good" in once_restart.stderr
                unknown = cli("restart-connector", "nobody", "--config", str(config))
                assert unknown.returncode == 1 and len(unknown.stderr.splitlines()) == 1
                assert "no connector is named 'nobody'" in unknown.stderr

                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
        assert not socket_path.exists()


class TestHealthy:
    async def test_check_passes_a_stale_socket_is_replaced_and_no_daemon_is_exit_2(self, tmp_path: Path):
        """--check exits 0 printing nothing; a killed daemon's socket is replaced; after the stop, exit 2."""
        config = write_config(tmp_path, [scripted_connector("up", {"manifest": CHAT_MANIFEST}, tmp_path,
                                                            grant=GRANT)])
        config.write_text(config.read_text() + '\n[control]\nsocket = "ctl.sock"\n')
        socket_path = tmp_path / "ctl.sock"
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(socket_path))  # bound, never listening, closed: what a killed daemon leaves
        stale.close()
        async with daemon(config, tmp_path) as run:
            await run.wait_event("host.ready")
            await run.wait_event("connector.up", connector="up")
            check = cli("status", "--config", str(config), "--check")
            assert (check.returncode, check.stdout, check.stderr) == (0, "", "")
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        assert not socket_path.exists()
        for command in (("status",), ("status", "--check"), ("status", "--json"), ("restart-connector", "up")):
            gone = cli(*command, "--config", str(config))
            assert gone.returncode == 2 and gone.stdout == "", gone
            (line,) = gone.stderr.splitlines()
            assert line.startswith("mcplhost: no daemon is running") and str(socket_path) in line


class TestQuietAndDeaf:
    async def test_a_quiet_and_a_deaf_connector_as_status_and_check_show_them(self, tmp_path: Path):
        """Over the real socket: `silent` (ready, nothing for expect_traffic_within_s) is quiet and --check names
        it; `deaf` (ping unanswered) has been restarted, its lastError saying why."""
        connectors = [
            scripted_connector("silent", {"manifest": CHAT_MANIFEST}, tmp_path, grant=GRANT,
                               expect_traffic_within_s=0.3),
            scripted_connector("deaf", {"manifest": CHAT_MANIFEST, "handlers": {"ping": "ignore"}}, tmp_path,
                               grant=GRANT, ping_interval_s=0.2, ping_timeout_s=0.5),
        ]
        config = write_config(tmp_path, connectors)
        async with daemon(config, tmp_path) as run:
            await run.wait_event("connector.quiet", connector="silent")
            await run.wait_event("connector.deaf", connector="deaf")
            await wait_for(lambda: by_name(status_object(config)["connectors"])["deaf"]["restarts"] >= 1, timeout=30)
            shown = by_name(status_object(config)["connectors"])
            assert shown["silent"]["quiet"] is True and shown["silent"]["state"] == "ready"
            assert shown["deaf"]["quiet"] is False and shown["deaf"]["lastError"].startswith("deaf:")
            check = status(config, "--check")
            assert check.returncode == 1
            assert any(line.startswith("silent:") and "quiet" in line for line in check.stdout.splitlines())
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0


class TestBrokenAgent:
    async def test_an_unset_key_is_warned_at_start_and_shows_in_status_check_and_metrics(self, tmp_path: Path):
        """docs/operations.md#the-status-fields: `api_key_env` names a variable `run` does not have. run warns once
        at start; the turn fails `missing_key`; status says so per agent, --check exits 1 naming it, and
        mcplhost_turns_total counts the failed turn, from the ledger."""
        connector = scripted_connector("up", {"manifest": CHAT_MANIFEST, "steps": [REGISTER, ADDRESSED]}, tmp_path,
                                       grant=GRANT)
        config = with_agents(write_config(tmp_path, [connector]),
                             ({"name": "scout", "wake_on": ["addressed"], "debounce_ms": 20},
                              {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1",
                               "api_key_env": "MCPLHOST_TEST_UNSET_KEY"}))
        config.write_text(config.read_text() + '\n[metrics]\nlisten = "127.0.0.1:0"\n')
        async with daemon(config, tmp_path, env={"MCPLHOST_TEST_UNSET_KEY": ""}) as run:
            warned = await run.wait_event("agent.api_key_unset", agent="scout")
            assert warned["variable"] == "MCPLHOST_TEST_UNSET_KEY" and warned["level"] == "warning"
            await run.wait_event("agent.turn", agent="scout", outcome="failed")
            (scout,) = status_object(config)["agents"]
            assert scout["lastError"] == "backend_error: missing_key" and scout["failedTurnsLastHour"] == 1
            check = status(config, "--check")
            assert check.returncode == 1
            assert check.stdout.splitlines() == [
                "scout: its newest turn failed (backend_error: missing_key); 1 failed turn in the last hour"]
            table = status(config).stdout.splitlines()
            header = next(line for line in table if line.startswith("AGENT"))
            assert header.split()[-4:] == ["FAILED/H", "HELD", "LAST", "ERROR"]
            row = next(line for line in table if line.startswith("scout")).split()
            assert row[-4:] == ["1", "-", "backend_error:", "missing_key"]  # FAILED/H, HELD, LAST ERROR
            address = (await run.wait_event("metrics.listening"))["address"]
            scraped = (await http_exchange(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")).decode()
            assert 'mcplhost_turns_total{agent="scout",outcome="failed"} 1.0' in scraped
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
            assert len(run.events("agent.api_key_unset")) == 1
