"""Quiet and deaf connectors: the rule on timestamps, and real scripted connectors inside a real Host."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.config import ConnectorConfig, RestartConfig
from mcplhost.protocol.ports import SERVING, State
from mcplhost.supervisor.liveness import deaf_error, is_quiet, quiet_at

from ..harness import CHAT_GRANT, CHAT_MANIFEST, config_with, record, scripted, wait_for
from ..memory_pair import memory_host
from .support import chat_steps, events, starts

#: Small numbers, so the live tests take a second or two.
EXPECT_S = 0.3
PING_INTERVAL_S = 0.2
PING_TIMEOUT_S = 0.5  # above the interval, so pings that piled up would show; loose enough for a loaded machine
#: Restarts fast enough for a quick test, and never the slow lane.
QUICK_RESTART = RestartConfig(policy="always", backoff_initial_s=0.05, backoff_max_s=0.1, burst=100, window_s=30)
WAIT_S = 15

#: Whole seconds as floats: their sums and differences are exact, so the property holds without rounding slack.
times = st.integers(min_value=0, max_value=10**6).map(float)
expects = st.integers(min_value=1, max_value=10**4).map(float)


class TestQuietRule:
    def test_quiet_only_strictly_after_the_expected_time(self) -> None:
        """Ready at 100 s, expecting traffic within 10 s: not quiet at 110 s, quiet just after."""
        assert not is_quiet(State.READY, 100.0, None, 110.0, 10.0)
        assert is_quiet(State.READY, 100.0, None, 110.001, 10.0)

    def test_an_inbound_item_restarts_the_wait(self) -> None:
        assert not is_quiet(State.READY, 100.0, 105.0, 114.9, 10.0)
        assert is_quiet(State.READY, 100.0, 105.0, 115.1, 10.0)

    def test_an_item_from_before_this_life_does_not_count(self) -> None:
        """The previous life's last item is older than this life's start: the wait runs from the start."""
        assert quiet_at(100.0, 50.0, 10.0) == 110.0

    def test_mcp_only_can_be_quiet_too(self) -> None:
        assert is_quiet(State.MCP_ONLY, 100.0, None, 200.0, 10.0)

    def test_without_the_setting_never_quiet(self) -> None:
        assert not is_quiet(State.READY, 0.0, None, 1e9, None)
        assert quiet_at(0.0, None, None) is None

    def test_never_ready_is_never_quiet(self) -> None:
        assert not is_quiet(State.HANDSHAKING, None, None, 1e9, 1.0)
        assert quiet_at(None, None, 1.0) is None

    @given(st.sampled_from(list(State)), st.one_of(st.none(), times), st.one_of(st.none(), times), times,
           st.one_of(st.none(), expects))
    def test_quiet_means_serving_and_silent_past_the_deadline(self, state: State, since: float | None,
                                                              last: float | None, now: float,
                                                              expect: float | None) -> None:
        deadline = quiet_at(since, last, expect)
        quiet = is_quiet(state, since, last, now, expect)
        assert quiet == (state in SERVING and deadline is not None and now > deadline)
        if quiet:
            assert since is not None and expect is not None and now - since > expect
            assert last is None or now - last > expect
            assert not is_quiet(state, since, now, now, expect)  # an item now ends it
            assert is_quiet(state, since, last, now + 1.0, expect)  # and it lasts until one comes

    def test_the_deaf_error_names_the_method_and_the_timeout(self) -> None:
        assert deaf_error(10.0) == "deaf: no answer to ping within 10 s"
        assert deaf_error(0.3) == "deaf: no answer to ping within 0.3 s"


def chatty(tmp_path: Path, name: str, **fields: Any) -> ConnectorConfig:
    """A chat connector that registers a room, then sends one message each time the host sends it test/speak."""
    steps: list[dict[str, Any]] = chat_steps(name, 0)
    for n in range(1, 4):
        steps += [{"wait": "test/speak", "count": n}, *chat_steps(name, n)[n:]]
    script = {"manifest": CHAT_MANIFEST, "steps": [*steps, {"wait": "never"}]}
    return scripted(name, script, tmp_path, grant=CHAT_GRANT, **fields)


class TestQuiet:
    async def test_a_silent_connector_becomes_quiet_once_per_spell(self, tmp_path, logs) -> None:
        """Ready and silent past expect_traffic_within_s: quiet in statistics, one warning; an item ends the spell."""
        spec = chatty(tmp_path, "hush", expect_traffic_within_s=EXPECT_S)
        other = chatty(tmp_path, "lax")  # no expectation: never quiet
        async with memory_host(config_with(tmp_path, spec, other)) as host:
            handle = host.connectors["hush"]
            await wait_for(lambda: handle.statistics().quiet)
            await wait_for(lambda: events(logs, "connector.quiet", "hush"))
            (onset,) = events(logs, "connector.quiet", "hush")
            (up,) = events(logs, "connector.up", "hush")
            assert onset["t"] - up["t"] > EXPECT_S  # not before the expectation ran out
            assert onset["log_level"] == "warning" and onset["expect_traffic_within_s"] == EXPECT_S
            assert onset["last_inbound_at"] is None
            # Let the spell outlast the expectation twice: still the one line.
            await wait_for(lambda: time.monotonic() - onset["t"] > 2 * EXPECT_S)
            assert len(events(logs, "connector.quiet", "hush")) == 1

            await handle.notify("test/speak", {})
            await wait_for(lambda: handle.statistics().last_inbound_at is not None)
            assert not handle.statistics().quiet
            await wait_for(lambda: events(logs, "connector.traffic_resumed", "hush"))
            (resumed,) = events(logs, "connector.traffic_resumed", "hush")
            assert resumed["log_level"] == "info" and resumed["quiet_s"] >= 2 * EXPECT_S

            # Silent again: a second spell, a second line.
            await wait_for(lambda: len(events(logs, "connector.quiet", "hush")) == 2)
            assert handle.statistics().quiet
            assert host.connectors["lax"].state is State.READY and not host.connectors["lax"].statistics().quiet
        assert not events(logs, "connector.quiet", "lax")


def pinged(tmp_path: Path, name: str, handlers: dict[str, Any] | None = None) -> ConnectorConfig:
    script = {"manifest": CHAT_MANIFEST, "handlers": handlers or {}, "steps": [{"wait": "never"}]}
    return scripted(name, script, tmp_path, grant=CHAT_GRANT, restart=QUICK_RESTART, stop_grace_s=0.5,
                    term_grace_s=0.5, ping_interval_s=PING_INTERVAL_S, ping_timeout_s=PING_TIMEOUT_S)


def pings(tmp_path: Path, name: str) -> list[list[dict[str, Any]]]:
    """The pings each life of scripted connector `name` received, one list per life."""
    lives: list[list[dict[str, Any]]] = []
    for event in record(tmp_path, name).events:
        if event["kind"] == "start":
            lives.append([])
        elif event["kind"] == "in" and event["message"].get("method") == "ping":
            lives[-1].append(event["message"])
    return lives


class TestDeaf:
    async def test_a_connector_that_ignores_ping_is_restarted_one_that_answers_is_not(self, tmp_path, logs) -> None:
        """Deaf: its life ends, last_error says why, one warning, a failure for the restart policy; the others stay."""
        deaf = pinged(tmp_path, "deaf", {"ping": "ignore"})
        hearing = pinged(tmp_path, "hearing")
        refusing = pinged(tmp_path, "refusing", {"ping": {"error": {"code": -32601, "message": "no ping here"}}})
        async with memory_host(config_with(tmp_path, deaf, hearing, refusing)) as host:
            steady = {name: host.connectors[name].statistics().pid for name in ("hearing", "refusing")}
            handle = host.connectors["deaf"]
            await wait_for(lambda: len(starts(tmp_path, "deaf")) >= 2 and handle.state is State.READY)
            await wait_for(lambda: all(len(pings(tmp_path, name)[0]) >= 3 for name in steady))
            stats = handle.statistics()
            assert stats.restarts >= 1 and stats.last_error == deaf_error(PING_TIMEOUT_S)
            for name, pid in steady.items():
                now = host.connectors[name].statistics()
                assert (now.state, now.pid, now.restarts, now.last_error) == (State.READY, pid, 0, None)
        warning = events(logs, "connector.deaf", "deaf")[0]
        assert warning["log_level"] == "warning" and warning["error"] == "deaf: no answer to ping within 0.5 s"
        assert (warning["ping_interval_s"], warning["ping_timeout_s"]) == (PING_INTERVAL_S, PING_TIMEOUT_S)
        assert events(logs, "connector.restart_scheduled", "deaf")[0]["failures"] == 1
        assert events(logs, "connector.exited", "deaf")[0]["ended"] == "deaf"
        assert len(pings(tmp_path, "deaf")[0]) == 1  # the unanswered ping was never joined by a second
        assert all(p == {"jsonrpc": "2.0", "id": p["id"], "method": "ping"} for p in pings(tmp_path, "hearing")[0])
        assert not events(logs, "connector.deaf", "hearing") and not events(logs, "connector.deaf", "refusing")
