"""`mcplhost.cli.main` called many times in one process: logging is configured afresh each time, nothing leaks."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import structlog

from mcplhost import logs

from .support import cli

#: How long a thread a call started may take to end after the call returned (a leaked one never ends).
THREAD_END_S = 5.0
#: Enough calls that a thread or a descriptor kept per call would show.
CALLS = 20


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "mcplhost-log-writer" and t.is_alive()]


class TestRepeatedCalls:
    def test_calls_leave_no_thread_and_each_gets_its_own_output(self, tmp_path) -> None:
        """Each call's log writer thread (and a search's worker) ends with the call; each call's stdout and
        stderr are its own."""
        (tmp_path / "empty.toml").write_text("", encoding="utf-8")
        assert cli("migrate", "--db", str(tmp_path / "host.db")).returncode == 0
        before = set(threading.enumerate())  # a thread an earlier test left may end meanwhile: compare sets
        for n in range(CALLS):
            ok = cli("check-config", str(tmp_path / "empty.toml"))
            missing = cli("messages", "--db", str(tmp_path / f"absent-{n}.db"))
            searched = cli("search", "--db", str(tmp_path / "host.db"), f"nothing {n}")
            assert (ok.returncode, ok.stdout, ok.stderr) == (0, "ok: 0 connector(s), 0 agent(s)\n", "")
            assert missing.returncode == 1 and missing.stdout == ""
            (line,) = missing.stderr.splitlines()
            assert f"absent-{n}.db: no such database" in line
            assert (searched.returncode, searched.stdout, searched.stderr) == (0, "", "")
        for thread in [t for t in threading.enumerate() if t not in before]:
            thread.join(timeout=THREAD_END_S)  # anyio's worker threads end just after their loop closes
        assert [t for t in threading.enumerate() if t not in before] == [] and not writer_threads()

    def test_configure_and_shutdown_hold_no_descriptor_per_call(self, tmp_path, monkeypatch) -> None:
        """With stderr a real file, each configuration's duplicate of it is given back at shutdown."""
        with open(tmp_path / "stderr.log", "w", encoding="utf-8") as stderr:
            monkeypatch.setattr(sys, "stderr", stderr)
            saved = structlog.get_config()
            try:
                logs.configure("json")
                logs.shutdown()
                before = open_descriptors()
                for n in range(CALLS):
                    logs.configure("json")
                    structlog.get_logger().info("test.call", n=n)
                    assert logs.shutdown()
                assert open_descriptors() == before
                structlog.get_logger().info("test.after_shutdown")  # written directly, through the stream
            finally:
                logs.shutdown()
                structlog.configure(**saved)
        text = Path(tmp_path / "stderr.log").read_text(encoding="utf-8")
        assert all(f'"n": {n}' in text for n in range(CALLS)) and "test.after_shutdown" in text

    def test_a_logger_taken_at_import_follows_the_latest_configuration(self) -> None:
        """A module's logger (taken once, at import) reaches the second configuration's tap and level, not the
        first's: `mcplhost dev` called twice in one process shows its events both times."""
        from mcplhost import host  # its module logger, `host.log`, was taken at import

        first: list[str] = []
        second: list[str] = []
        saved = structlog.get_config()
        try:
            logs.configure("json", "info", tap=lambda event: first.append(event["event"]), show=False)
            host.log.info("test.first")
            logs.shutdown()
            logs.configure("json", "warning", tap=lambda event: second.append(event["event"]), show=False)
            host.log.info("test.below_the_level")
            host.log.warning("test.second")
            logs.shutdown()
        finally:
            structlog.configure(**saved)
        assert first == ["test.first"] and second == ["test.second"]
