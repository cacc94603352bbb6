"""The per-connector owner task inside a real Host: handshake order, isolation, environment and stopping."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import anyio
import msgspec
import pytest

from mcplhost.config import ConnectorConfig, RestartConfig
from mcplhost.supervisor.handle import ConnectorHandle
from mcplhost.supervisor.supervise import _ended_unanswered, _exit_error, supervise

from ..builders import texts
from ..harness import (
    CHAT_GRANT,
    CHAT_MANIFEST,
    PYTHON,
    config_with,
    record,
    running_host,
    scripted,
    stored_items,
    wait_for,
)
from .support import accepted, chat_steps, events, real_intake, starts

#: Slack on top of configured grace periods for scheduling and process exit on a busy machine.
SLACK_S = 1.5
LOOPING = RestartConfig(policy="always", backoff_initial_s=0.05, backoff_max_s=0.2, burst=100, window_s=5)


def chat(name: str, tmp_path: Path, count: int, **fields) -> ConnectorConfig:
    return scripted(name, {"manifest": CHAT_MANIFEST, "steps": chat_steps(name, count)}, tmp_path,
                    grant=CHAT_GRANT, **fields)


class TestHandshake:
    async def test_initialize_then_initialized_then_the_policy(self, tmp_path) -> None:
        """The host's first messages are initialize, notifications/initialized, then featureSets/update."""
        async with running_host(config_with(tmp_path, chat("disc", tmp_path, 0))):
            await wait_for(lambda: record(tmp_path, "disc").done)
        received = record(tmp_path, "disc").received
        assert [m.get("method") for m in received[:3]] == ["initialize", "notifications/initialized",
                                                           "featureSets/update"]
        assert "id" in received[0] and "id" not in received[1] and "id" in received[2]

    async def test_a_plain_mcp_connector_gets_initialized_and_no_policy(self, tmp_path) -> None:
        """Without an MCPL manifest the handshake is initialize and initialized only."""
        spec = scripted("plain", {"manifest": None, "after": "initialized", "steps": [{"sleep": 0.3}]}, tmp_path)
        async with running_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "plain").done)
        assert record(tmp_path, "plain").methods_received() == ["initialize", "notifications/initialized"]

    async def test_initialized_comes_before_the_answer_to_an_early_request(self, tmp_path) -> None:
        """A request sent right behind the initialize result is answered only after notifications/initialized."""
        log = tmp_path / "raw.log"
        # Writes its initialize result and a ping in one write, then records every line it gets.
        source = textwrap.dedent(f"""
            import json, sys
            seen = open({str(log)!r}, "a")
            request = json.loads(sys.stdin.readline())
            result = {{"protocolVersion": "2024-11-05", "capabilities": {{}}, "serverInfo": {{"name": "raw"}}}}
            sys.stdout.write(json.dumps({{"jsonrpc": "2.0", "id": request["id"], "result": result}}) + "\\n"
                             + json.dumps({{"jsonrpc": "2.0", "id": 1, "method": "ping"}}) + "\\n")
            sys.stdout.flush()
            for line in sys.stdin:
                seen.write(line)
                seen.flush()
        """)
        spec = ConnectorConfig(name="raw", command=[PYTHON, "-c", source], restart=RestartConfig(policy="never"))
        async with running_host(config_with(tmp_path, spec)):
            await wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 2)
        first = log.read_text().splitlines()[0]
        assert '"notifications/initialized"' in first, first


class TestIsolation:
    async def test_a_crash_looping_connector_does_not_disturb_another(self, tmp_path, logs) -> None:
        """While one connector crash-loops, the other runs one life and every message of it is stored."""
        looper = scripted("looper", {"after": "start", "steps": [{"exit": 1}]}, tmp_path, restart=LOOPING)
        steady = scripted("steady", {"manifest": CHAT_MANIFEST, "steps": chat_steps("steady", 8, pause=0.05)},
                          tmp_path, grant=CHAT_GRANT, restart=LOOPING)
        async with running_host(config_with(tmp_path, looper, steady)):
            await wait_for(lambda: record(tmp_path, "steady").done and len(starts(tmp_path, "looper")) >= 4)
            assert len(starts(tmp_path, "looper")) >= 4
        answers = record(tmp_path, "steady").answers()
        assert all(accepted(answers[step]) for step in range(2, 17, 2)), answers
        assert len(starts(tmp_path, "steady")) == 1
        assert sorted(texts(i.content)[1] for i in await stored_items(tmp_path)) == [f"steady says {n}" for n in range(8)]
        assert not events(logs, "connector.restart_scheduled", "steady")

    async def test_a_connector_that_cannot_spawn_does_not_disturb_another(self, tmp_path, logs) -> None:
        """A connector whose command does not exist is retried on its own; the other connector delivers."""
        ghost = ConnectorConfig(name="ghost", command=[str(tmp_path / "missing")], restart=LOOPING)
        async with running_host(config_with(tmp_path, ghost, chat("steady", tmp_path, 3))):
            await wait_for(lambda: record(tmp_path, "steady").done
                           and len(events(logs, "connector.spawn_failed", "ghost")) >= 2)
        assert len(await stored_items(tmp_path)) == 3

    async def test_megabytes_of_stderr_do_not_stall_the_host(self, tmp_path, logs) -> None:
        """A connector writing megabytes to stderr still gets its messages stored, and so does its neighbour."""
        chatty_steps = [{"stderr": "e" * 99, "repeat": 60_000}, *chat_steps("chatty", 2)]
        chatty = scripted("chatty", {"manifest": CHAT_MANIFEST, "steps": chatty_steps}, tmp_path, grant=CHAT_GRANT)
        async with running_host(config_with(tmp_path, chatty, chat("quiet", tmp_path, 2))):
            with anyio.fail_after(20):
                await wait_for(lambda: record(tmp_path, "chatty").done and record(tmp_path, "quiet").done)
        assert len(await stored_items(tmp_path)) == 4
        logged = events(logs, "connector.stderr", "chatty")
        dropped = sum(e["lines"] for e in events(logs, "connector.stderr_dropped", "chatty"))
        assert dropped > 0 and len(logged) + dropped >= 60_000 - 65536 // 100  # less what sat in the pipe


class TestFailureDescriptions:
    """A connector that dies before answering is described by its exit, not by a broken pipe."""

    async def run_to_the_end(self, spec: ConnectorConfig, tmp_path: Path) -> ConnectorHandle:
        handle = ConnectorHandle(spec)
        async with real_intake(tmp_path) as intake:
            with anyio.fail_after(20):
                await supervise(spec, intake, handle=handle)  # restart policy never: returns after one life
        return handle

    async def test_a_child_exiting_at_once_is_described_by_its_exit_code(self, tmp_path, logs) -> None:
        """A child that exits with code 3 before reading anything: "the process exited with code 3 before ..."."""
        spec = ConnectorConfig(name="quitter", command=[PYTHON, "-c", "import sys; sys.exit(3)"],
                               restart=RestartConfig(policy="never"))
        handle = await self.run_to_the_end(spec, tmp_path)
        expected = "the process exited with code 3 before answering initialize"
        (failed,) = events(logs, "connector.handshake_failed", "quitter")
        assert failed["error"] == expected
        assert handle.statistics().last_error == expected
        assert not [e for e in logs if e.get("connector") == "quitter" and e["log_level"] in ("warning", "error")
                    and "BrokenResourceError" in str(e)]

    async def test_a_child_exiting_on_initialize_is_described_by_its_exit_code(self, tmp_path, logs) -> None:
        """A child that reads initialize and exits with code 3 gets the same description."""
        spec = scripted("reader", {"initialize": "exit"}, tmp_path)
        await self.run_to_the_end(spec, tmp_path)
        (failed,) = events(logs, "connector.handshake_failed", "reader")
        assert failed["error"] == "the process exited with code 3 before answering initialize"

    async def test_a_handshake_timeout_keeps_its_own_description(self, tmp_path, logs) -> None:
        """A child that lives but never answers is still described as a timeout, not as an exit."""
        spec = scripted("mute", {"initialize": "ignore"}, tmp_path, request_timeout_s=0.3)
        await self.run_to_the_end(spec, tmp_path)
        (failed,) = events(logs, "connector.handshake_failed", "mute")
        assert "no answer to initialize within 0.3 s" in failed["error"]
        # The usual cause, said where the operator looks (the log and status lastError): the answer sits unflushed.
        assert failed["error"].endswith("; a connector must flush stdout after each line it writes (a pipe is not "
                                        "a terminal: docs/connectors.md#1-wire-rules)")

    async def test_an_exit_after_the_handshake_is_the_last_error(self, tmp_path, logs) -> None:
        """A ready connector exiting with code 5 leaves "the process exited with code 5" as its last error."""
        spec = scripted("done", {"manifest": CHAT_MANIFEST, "exit_after": 5}, tmp_path, grant=CHAT_GRANT)
        handle = await self.run_to_the_end(spec, tmp_path)
        assert handle.statistics().last_error == "the process exited with code 5"
        (stopped,) = events(logs, "connector.stopped", "done")
        assert stopped["previous"] == "ready" and stopped["last"] == "exited"


class TestEnvironment:
    async def test_systemd_variables_never_reach_a_connector(self, tmp_path, monkeypatch) -> None:
        """NOTIFY_SOCKET, WATCHDOG_* and the host's other variables stay out of a child's environment; its env is added."""
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
        monkeypatch.setenv("WATCHDOG_USEC", "10000000")
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
        monkeypatch.setenv("MCPLHOST_TEST_INHERITED", "yes")
        spec = scripted("envy", {"manifest": CHAT_MANIFEST, "record_env": True}, tmp_path, grant=CHAT_GRANT)
        spec = msgspec.structs.replace(spec, env={**spec.env, "GUILDS": "acme"})
        async with running_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "envy").done)
        (start,) = starts(tmp_path, "envy")
        env = start["env"]
        assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} & set(env)
        assert env["GUILDS"] == "acme" and "MCPLHOST_TEST_INHERITED" not in env


class TestStopping:
    async def test_a_connector_ignoring_eof_and_sigterm_is_killed_within_its_graces(self, tmp_path, logs) -> None:
        """On host stop a stubborn connector gets stop_grace_s, then SIGTERM and term_grace_s, then SIGKILL."""
        spec = scripted("stubborn", {"manifest": CHAT_MANIFEST, "ignore_sigterm": True, "ignore_eof": True},
                        tmp_path, grant=CHAT_GRANT, stop_grace_s=0.3, term_grace_s=0.3)
        async with running_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "stubborn").done)
            began = time.monotonic()
        elapsed = time.monotonic() - began
        assert 0.6 <= elapsed < 0.6 + SLACK_S
        (exited,) = events(logs, "connector.exited", "stubborn")
        assert exited["how"] == "killed" and exited["returncode"] == -signal.SIGKILL
        assert events(logs, "connector.kill", "stubborn")
        (start,) = starts(tmp_path, "stubborn")
        with pytest.raises(ProcessLookupError):
            os.kill(start["pid"], 0)

    async def test_a_stopped_host_does_not_restart_its_connectors(self, tmp_path, logs) -> None:
        """A connector the host stopped is not a failure: nothing is scheduled after the stop."""
        spec = chat("calm", tmp_path, 0, restart=LOOPING)
        async with running_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "calm").done)
        assert events(logs, "connector.exited", "calm")[0]["how"] == "exited"
        assert not events(logs, "connector.restart_scheduled", "calm")
        assert len(starts(tmp_path, "calm")) == 1



class TestExitError:
    def test_an_exit_before_the_handshake_ended_names_what_it_left_unanswered(self) -> None:
        """The one wording of a handshake the child's exit ended, whichever task saw the exit first (the
        handshake's own failure, or the output's end ending the life under load)."""
        from mcplhost.protocol.connection import Mode

        assert _ended_unanswered(3, Mode.HANDSHAKE) == "the process exited with code 3 before answering initialize"
        assert _ended_unanswered(None, Mode.HANDSHAKE) == "the process closed its output before answering initialize"
        assert _exit_error(3) == "the process exited with code 3"
