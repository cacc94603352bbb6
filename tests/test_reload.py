"""mcplhost/reload.py `Reloads`: one reload at a time, cancelled by the stop, none able to end the daemon."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from mcplhost.config import Config
from mcplhost.errors import ConfigError
from mcplhost.reload import Reloads

from .harness import logged


class Target:
    """A host stand-in: records each config it is given, and does what `behave` says with it."""

    def __init__(self, behave: Any = None) -> None:
        self.given: list[Config] = []
        self.entered = anyio.Event()
        self.behave = behave

    async def reload(self, new: Config) -> None:
        self.given.append(new)
        self.entered.set()
        if self.behave is not None:
            await self.behave()


def refused() -> Config:
    raise ConfigError("mcplhost.toml: 1 problem(s)", problems=["connectors[0].command: required"])


class TestOnce:
    async def test_an_invalid_file_is_refused_with_its_problems_and_the_host_is_not_asked(self) -> None:
        target = Target()
        with capture_logs() as logs:
            await Reloads(refused).once(target)
        (line,) = logged(logs, "host.reload_refused")
        assert line["log_level"] == "warning" and line["problems"] == ["connectors[0].command: required"]
        assert target.given == []

    async def test_a_config_the_host_cannot_build_is_refused_with_every_problem(self) -> None:
        async def cannot_build() -> None:
            raise ConfigError("2 problem(s)", problems=["agents[0].backend: cannot be built: InvalidURL: x", "y"])

        with capture_logs() as logs:
            await Reloads(Config).once(Target(cannot_build))
        (line,) = logged(logs, "host.reload_refused")
        assert line["problems"] == ["agents[0].backend: cannot be built: InvalidURL: x", "y"]

    @pytest.mark.parametrize("where", ["reread", "reload"])
    async def test_a_bug_in_a_reload_is_logged_and_the_caller_goes_on(self, where: str) -> None:
        """The exception boundary: whatever a reload raises (but a cancellation) is logged, never raised."""
        def bug() -> Config:
            raise KeyError("a bug")

        async def bug_halfway() -> None:
            raise RuntimeError("a bug halfway")

        with capture_logs() as logs:
            await Reloads(bug if where == "reread" else Config).once(Target(None if where == "reread" else bug_halfway))
        (line,) = logged(logs, "host.reload_failed")
        assert line["log_level"] == "error" and line["exc_info"] is True


class TestRun:
    async def test_the_stop_cancels_a_reload_in_progress(self) -> None:
        """A reload waiting (for a turn with a hung model) never holds up the stop: the stop cancels it."""
        target = Target(anyio.sleep_forever)
        reloads, stop = Reloads(Config), anyio.Event()
        with capture_logs() as logs, anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(reloads.run, target, stop)
                reloads.request()
                await target.entered.wait()
                stop.set()
        assert len(target.given) == 1 and logged(logs, "host.reload_cancelled")

    async def test_sighups_during_a_reload_make_one_more(self) -> None:
        gate = anyio.Event()
        target = Target(gate.wait)
        reloads, stop = Reloads(Config), anyio.Event()
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(reloads.run, target, stop)
                reloads.request()
                await target.entered.wait()
                target.entered = anyio.Event()
                for _ in range(3):
                    reloads.request()
                gate.set()
                await target.entered.wait()  # the second reload, after the first ended
                await anyio.wait_all_tasks_blocked()
                stop.set()
        assert len(target.given) == 2
