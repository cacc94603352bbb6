"""systemd's STATUS= line (mcplhost/control/notify.py): after changes, rate-limited, only when the text changed."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import structlog

from mcplhost.control import notify
from mcplhost.control.notify import StatusLine
from mcplhost.protocol.ports import State
from mcplhost.supervisor.handle import ConnectorHandle
from mcplhost.systemd import Notifier

from ..harness import scripted, wait_for


class Recording(Notifier):
    """A Notifier that keeps what it would send."""

    def __init__(self) -> None:
        super().__init__(None, structlog.get_logger())
        self.sent: list[str] = []

    def send(self, state: str) -> None:
        self.sent.append(state)


def handles(line: StatusLine, folder: Path, *names: str) -> dict[str, ConnectorHandle]:
    return {name: ConnectorHandle(scripted(name, {}, folder), on_change=line.changed) for name in names}


class TestStatusLine:
    async def test_a_burst_of_changes_is_one_line_per_interval(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        """Many changes inside one interval: the first is sent, the rest wait for the interval's end."""
        monkeypatch.setattr(notify, "STATUS_INTERVAL_S", 3600.0)
        line, notifier = StatusLine(), Recording()
        connectors = handles(line, tmp_path, "a", "b")
        async with anyio.create_task_group() as tg:
            tg.start_soon(line.run, notifier, connectors)
            connectors["a"].life.waiting(State.BACKOFF)  # a handle begins in starting
            await wait_for(lambda: notifier.sent)
            for _ in range(50):  # a crash loop's worth of changes
                connectors["b"].life.waiting(State.BACKOFF)
                connectors["b"].life.starting()
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        assert notifier.sent == ["STATUS=2 connectors: 1 starting, 1 backoff"]

    async def test_the_settled_counts_are_sent_and_an_unchanged_text_is_not_repeated(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        """With no interval, each distinct text is sent once; a change back and forth to the same counts is not."""
        monkeypatch.setattr(notify, "STATUS_INTERVAL_S", 0.0)
        line, notifier = StatusLine(), Recording()
        connectors = handles(line, tmp_path, "a")
        async with anyio.create_task_group() as tg:
            tg.start_soon(line.run, notifier, connectors)
            connectors["a"].life.waiting(State.BACKOFF)
            await wait_for(lambda: notifier.sent == ["STATUS=1 connector: 1 backoff"])
            connectors["a"].life.starting()
            await wait_for(lambda: len(notifier.sent) == 2)
            line.changed()  # a change that leaves the counts as they were
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        assert notifier.sent == ["STATUS=1 connector: 1 backoff", "STATUS=1 connector: 1 starting"]

    async def test_a_connector_on_standby_is_counted_as_standby_not_starting(self, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
        """Its handle never leaves `starting` while another host runs it; `is_standby` says so."""
        monkeypatch.setattr(notify, "STATUS_INTERVAL_S", 0.0)
        line, notifier = StatusLine(), Recording()
        connectors = handles(line, tmp_path, "a", "b")
        standby = {"b"}
        async with anyio.create_task_group() as tg:
            tg.start_soon(line.run, notifier, connectors, standby.__contains__)
            connectors["a"].life.waiting(State.BACKOFF)
            await wait_for(lambda: notifier.sent == ["STATUS=2 connectors: 1 standby, 1 backoff"])
            standby.clear()  # b's owner died: this host takes it over and starts it
            connectors["b"].life.waiting(State.BACKOFF)
            await wait_for(lambda: len(notifier.sent) == 2)
            tg.cancel_scope.cancel()
        assert notifier.sent[-1] == "STATUS=2 connectors: 2 backoff"
