"""`supervise` restarting real connector processes by README.md#configuration-reference's restart arithmetic."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcplhost.config import ConnectorConfig, RestartConfig
from mcplhost.supervisor.policy import JITTER
from mcplhost.supervisor.supervise import supervise

from ..harness import CHAT_GRANT, CHAT_MANIFEST, PYTHON, scripted, wait_for
from .support import events, real_intake, starts

#: Small, fast numbers: the delays go 0.05, 0.1, 0.2, then the 0.4 cap.
FAST = {"backoff_initial_s": 0.05, "backoff_max_s": 0.4, "window_s": 5.0}


def restart(**fields: Any) -> RestartConfig:
    return RestartConfig(**{**FAST, **fields})


def crasher(tmp_path: Path, name: str = "crash", code: int = 1, **restart_fields: Any) -> ConnectorConfig:
    """A scripted connector that completes its handshake and then exits with `code`."""
    return scripted(name, {"manifest": CHAT_MANIFEST, "exit_after": code}, tmp_path, grant=CHAT_GRANT,
                    restart=restart(**restart_fields), stop_grace_s=0.5, term_grace_s=0.5)


def expected_delay(n: int, config: RestartConfig) -> tuple[float, float]:
    base = config.backoff_initial_s * 2 ** (n - 1)
    return min(base * (1 - JITTER), config.backoff_max_s), min(base * (1 + JITTER), config.backoff_max_s)


async def supervise_until(spec: ConnectorConfig, tmp_path: Path, condition: Any, timeout: float = 20) -> None:
    """Run `supervise` for `spec` until `condition()` holds, then cancel it (the host stopping)."""
    async with real_intake(tmp_path) as intake, anyio.create_task_group() as tg:
        tg.start_soon(supervise, spec, intake)
        await wait_for(condition, timeout=timeout)
        tg.cancel_scope.cancel()


class TestBackoff:
    async def test_a_child_exiting_1_is_restarted_with_growing_delays(self, tmp_path, logs) -> None:
        """Each restart waits initial×2^(n−1) ±20% (capped) after the exit, and the waits grow."""
        spec = crasher(tmp_path, burst=10)
        await supervise_until(spec, tmp_path, lambda: len(starts(tmp_path, "crash")) >= 5)
        scheduled = events(logs, "connector.restart_scheduled", "crash")[:4]
        assert [e["failures"] for e in scheduled] == [1, 2, 3, 4]
        delays = [e["delay_s"] for e in scheduled]
        for n, delay in enumerate(delays, start=1):
            low, high = expected_delay(n, spec.restart)
            assert low - 0.001 <= delay <= high + 0.001, (n, delays)
        assert delays == sorted(delays) and len(set(delays)) == 4
        lives = starts(tmp_path, "crash")
        for decision, later in zip(scheduled, lives[1:]):
            assert later["t"] - decision["t"] >= decision["delay_s"] - 0.01  # it really waited
        assert not events(logs, "connector.slow_lane", "crash")

    async def test_an_exit_with_code_0_is_a_failure_too(self, tmp_path, logs) -> None:
        """Any exit the host did not ask for counts, so policy on-failure restarts a child that exits 0."""
        spec = crasher(tmp_path, code=0, burst=10)
        await supervise_until(spec, tmp_path, lambda: len(starts(tmp_path, "crash")) >= 2)
        (first, *_) = events(logs, "connector.restart_scheduled", "crash")
        assert first["failures"] == 1

    async def test_a_handshake_that_never_completes_is_a_failure(self, tmp_path, logs) -> None:
        """A child that exits before answering initialize is restarted like any other failure."""
        spec = scripted("early", {"initialize": "exit"}, tmp_path, restart=restart(burst=10))
        await supervise_until(spec, tmp_path, lambda: len(starts(tmp_path, "early")) >= 3)
        assert events(logs, "connector.handshake_failed", "early")
        assert [e["failures"] for e in events(logs, "connector.restart_scheduled", "early")][:2] == [1, 2]


class TestSlowLane:
    async def test_burst_failures_within_the_window_go_to_the_slow_lane(self, tmp_path, logs) -> None:
        """The burst-th failure in window_s starts the slow lane: one start every backoff_max_s, logged as such."""
        spec = crasher(tmp_path, burst=3)
        await supervise_until(spec, tmp_path, lambda: len(starts(tmp_path, "crash")) >= 5)
        fast = events(logs, "connector.restart_scheduled", "crash")
        slow = events(logs, "connector.slow_lane", "crash")
        assert [e["failures"] for e in fast] == [1, 2]
        assert [e["failures"] for e in slow][:2] == [3, 4]
        cap = spec.restart.backoff_max_s
        for decision in slow:
            assert cap * (1 - JITTER) - 0.001 <= decision["delay_s"] <= cap
            assert decision["log_level"] == "warning"
        lives = starts(tmp_path, "crash")
        assert lives[4]["t"] - lives[3]["t"] >= spec.restart.backoff_max_s * (1 - JITTER)

    async def test_a_connector_that_stays_up_for_the_window_starts_over(self, tmp_path, logs) -> None:
        """After a life of window_s or more, the next failure is failure 1 again, out of the slow lane."""
        counter = tmp_path / "lives"
        # Lives 1-3 exit at once (the slow lane), life 4 stays up past window_s then exits, life 5 stays.
        source = textwrap.dedent(f"""
            import pathlib, sys, time
            counter = pathlib.Path({str(counter)!r})
            life = int(counter.read_text()) + 1 if counter.exists() else 1
            counter.write_text(str(life))
            time.sleep({{4: 1.3}}.get(life, 0 if life < 4 else 60))
            sys.exit(1)
        """)
        spec = ConnectorConfig(name="phoenix", command=[PYTHON, "-c", source], request_timeout_s=30,
                               restart=restart(burst=3, window_s=1.0), stop_grace_s=0.2, term_grace_s=0.2)
        await supervise_until(spec, tmp_path, lambda: counter.exists() and counter.read_text() == "5")
        decisions = sorted(events(logs, "connector.restart_scheduled", "phoenix")
                           + events(logs, "connector.slow_lane", "phoenix"), key=lambda e: e["t"])
        assert [(e["event"].rpartition(".")[2], e["failures"]) for e in decisions] == [
            ("restart_scheduled", 1), ("restart_scheduled", 2), ("slow_lane", 3), ("restart_scheduled", 1)]
        low, high = expected_delay(1, spec.restart)
        assert low - 0.001 <= decisions[-1]["delay_s"] <= high + 0.001


class TestPolicyNever:
    async def test_policy_never_stops_after_one_exit(self, tmp_path, logs) -> None:
        """Under policy never, supervise returns after the first exit, with one start and a stop logged."""
        spec = crasher(tmp_path, policy="never")
        async with real_intake(tmp_path) as intake:
            with anyio.fail_after(20):
                await supervise(spec, intake)
        assert len(starts(tmp_path, "crash")) == 1
        (stopped,) = events(logs, "connector.stopped", "crash")
        assert stopped["reason"] == "restart policy is never" and stopped["last"] == "exited"
        assert not events(logs, "connector.restart_scheduled")


class TestSpawnFailure:
    @pytest.fixture
    def missing(self, tmp_path) -> list[str]:
        return [str(tmp_path / "no-such-connector"), "--flag"]

    async def test_a_command_that_does_not_exist_is_logged_and_retried(self, tmp_path, logs, missing) -> None:
        """A failed spawn is a logged failure, retried with the backoff like a crash."""
        spec = ConnectorConfig(name="ghost", command=missing, restart=restart(burst=10))
        await supervise_until(spec, tmp_path, lambda: len(events(logs, "connector.spawn_failed", "ghost")) >= 3)
        failed = events(logs, "connector.spawn_failed", "ghost")
        assert failed[0]["command"] == missing and "no-such-connector" in failed[0]["error"]
        assert failed[0]["log_level"] == "error"
        assert [e["failures"] for e in events(logs, "connector.restart_scheduled", "ghost")][:2] == [1, 2]

    async def test_a_command_that_does_not_exist_stops_under_policy_never(self, tmp_path, logs, missing) -> None:
        """Under policy never a failed spawn is tried once, then the connector is stopped."""
        spec = ConnectorConfig(name="ghost", command=missing, restart=restart(policy="never"))
        async with real_intake(tmp_path) as intake:
            with anyio.fail_after(10):
                await supervise(spec, intake)
        assert len(events(logs, "connector.spawn_failed", "ghost")) == 1
        (stopped,) = events(logs, "connector.stopped", "ghost")
        assert stopped["last"] == "spawn_failed"
