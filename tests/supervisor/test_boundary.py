"""Each connector is an exception boundary: a bug in the host's code for one connector ends only that life.

The fault is raised while the session reads the connector's output (an
in-memory pair's `fault`, tests/memory_pair.py), standing in for a bug that
hostile output sets off in the session or protocol code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from mcplhost.config import RestartConfig
from mcplhost.supervisor.handle import State
from mcplhost.supervisor.supervise import CRASH_ERROR_CHARS, crash_error
from mcplhost.tracebacks import TRACEBACK_MAX_CHARS, bounded_traceback

from ..harness import CHAT_GRANT, CHAT_MANIFEST, config_with, record, scripted, wait_for
from ..memory_pair import memory_host
from .support import accepted, chat_steps, events, starts

FAST = RestartConfig(backoff_initial_s=0.05, backoff_max_s=0.4, window_s=5.0)


class ProtocolBug(Exception):
    """What the fault raises: an error no layer of the connection expects."""


def crash_once_on_incoming(crashed: list[str]) -> Any:
    """A fault that raises the first time `bad` writes a channels/incoming line."""

    def fault(name: str, chunk: bytes) -> None:
        if name == "bad" and b"channels/incoming" in chunk and not crashed:
            crashed.append(name)
            raise ProtocolBug("a bug set off by what bad sent")

    return fault


class TestConnectorBoundary:
    async def test_a_crash_in_one_connector_s_protocol_code_restarts_it_and_its_neighbour_is_served(
            self, tmp_path: Path, logs: list[dict[str, Any]]) -> None:
        """bad's session raises: its life ends as a crash (logged once, traceback) and it restarts; good goes on."""
        crashed: list[str] = []
        bad = scripted("bad", {"manifest": CHAT_MANIFEST, "steps": chat_steps("bad", 2)}, tmp_path,
                       grant=CHAT_GRANT, restart=FAST, stop_grace_s=0.5, term_grace_s=0.5)
        good = scripted("good", {"manifest": CHAT_MANIFEST, "steps": chat_steps("good", 20, pause=0.05)}, tmp_path,
                        grant=CHAT_GRANT, restart=FAST)
        async with memory_host(config_with(tmp_path, bad, good), fault=crash_once_on_incoming(crashed)) as host:
            await wait_for(lambda: len(starts(tmp_path, "bad")) >= 2, timeout=20)
            await host.connectors["bad"].wait_state(State.READY)
            await wait_for(lambda: len([e for e in _answers(tmp_path, "good") if accepted(e)]) == 20, timeout=20)
            await wait_for(lambda: len([e for e in _answers(tmp_path, "bad") if accepted(e)]) >= 2, timeout=20)
            stats = host.connectors["bad"].statistics()
            good_state = host.connectors["good"].state
        assert crashed == ["bad"]
        (crash,) = events(logs, "connector.crashed", "bad")
        assert crash["log_level"] == "error" and "Traceback (most recent call last)" in crash["traceback"]
        assert "ProtocolBug: a bug set off by what bad sent" in crash["traceback"]
        assert "ProtocolBug: a bug set off by what bad sent" in crash["error"]
        assert [e["failures"] for e in events(logs, "connector.restart_scheduled", "bad")] == [1]
        assert stats.restarts == 1 and stats.last_error is not None and "ProtocolBug" in stats.last_error
        assert good_state is State.READY and len(starts(tmp_path, "good")) == 1  # never touched
        assert not events(logs, "connector.crashed", "good")

    async def test_a_connector_that_crashes_the_host_s_code_every_life_goes_to_the_slow_lane(
            self, tmp_path: Path, logs: list[dict[str, Any]]) -> None:
        """The restart policy holds for crashes as for exits: burst crashes in the window mean the slow lane."""

        def always(name: str, chunk: bytes) -> None:
            if b"channels/incoming" in chunk:
                raise ProtocolBug("again")

        spec = scripted("bad", {"manifest": CHAT_MANIFEST, "steps": chat_steps("bad", 1)}, tmp_path,
                        grant=CHAT_GRANT, restart=RestartConfig(backoff_initial_s=0.02, backoff_max_s=0.2, burst=3,
                                                                window_s=30.0), stop_grace_s=0.2, term_grace_s=0.2)
        async with memory_host(config_with(tmp_path, spec), fault=always):
            await wait_for(lambda: events(logs, "connector.slow_lane", "bad"), timeout=20)
        assert len(events(logs, "connector.crashed", "bad")) >= 3
        assert [e["failures"] for e in events(logs, "connector.restart_scheduled", "bad")] == [1, 2]

    async def test_the_host_stopping_still_cancels_a_connector(self, tmp_path: Path,
                                                               logs: list[dict[str, Any]]) -> None:
        """Cancellation is not a crash: a stop while serving logs no connector.crashed and no restart."""
        spec = scripted("calm", {"manifest": CHAT_MANIFEST, "steps": chat_steps("calm", 1)}, tmp_path,
                        grant=CHAT_GRANT, restart=FAST)
        with anyio.fail_after(20):
            async with memory_host(config_with(tmp_path, spec)) as host:
                await host.connectors["calm"].wait_state(State.READY)
        assert not events(logs, "connector.crashed")
        assert not events(logs, "connector.restart_scheduled")
        assert host.connectors["calm"].state is State.STOPPED


def test_a_crash_s_error_names_the_first_leaf_of_a_group_and_is_bounded() -> None:
    group = ExceptionGroup("tasks", [ValueError("bad line"), KeyError("x")])
    assert crash_error(group) == "ValueError: bad line"
    long = crash_error(RuntimeError("x" * 10_000))
    assert len(long) == CRASH_ERROR_CHARS + 1 and long.startswith("RuntimeError: xxx")


def test_a_logged_traceback_is_bounded_whatever_the_message() -> None:
    """A message holding a megabyte a connector sent: the middle is cut, the raise site and the type kept."""
    try:
        raise ProtocolBug("x" * 1_000_000)
    except ProtocolBug as exc:
        text = bounded_traceback(exc)
    assert len(text) < TRACEBACK_MAX_CHARS + 100
    assert text.startswith("Traceback (most recent call last)") and "characters cut" in text
    assert "raise ProtocolBug" in text


def _answers(folder: Path, name: str) -> list[dict[str, Any]]:
    """The host's answers to the connector's requests, by step (a later life's replace an earlier one's)."""
    return list(record(folder, name).answers().values())
