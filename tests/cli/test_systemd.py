"""The systemd notify protocol: the Notifier on real datagram sockets, and `mcplhost run` under NOTIFY_SOCKET."""

from __future__ import annotations

import os
import shlex
import signal
import tempfile
from pathlib import Path

import structlog
from structlog.testing import capture_logs

from mcplhost.systemd import Notifier, watchdog_interval_s

from ..harness import CHAT_GRANT, CHAT_MANIFEST, PYTHON, record, wait_for
from .held_loop import HELD_LOOP_FILE, HELD_LOOP_S, held_record, sent
from .support import NotifySocket, daemon, scripted_connector, write_config

#: Slack for process start-up and scheduling on a busy machine.
SLACK_S = 3.0
#: The held-loop test's WATCHDOG_USEC: a ping every 0.1 s.
HELD_WATCHDOG_USEC = 200_000
#: How many ping intervals the loop stays held: long enough that a ping sent anyway could not be missed.
HELD_INTERVALS = 5


def chat(name: str, folder: Path, **fields) -> dict:
    return scripted_connector(name, {"manifest": CHAT_MANIFEST}, folder, grant=CHAT_GRANT, **fields)


def first_start(folder: Path, name: str) -> float:
    return next(e["t"] for e in record(folder, name).events if e["kind"] == "start")


class TestNotifier:
    def test_a_path_socket_receives_the_state(self) -> None:
        """A filesystem NOTIFY_SOCKET gets each state as one datagram."""
        with tempfile.TemporaryDirectory(dir="/tmp") as folder, NotifySocket(f"{folder}/notify") as sock:
            notifier = Notifier(sock.address, structlog.get_logger())
            try:
                notifier.send("READY=1")
                notifier.send("STOPPING=1")
            finally:
                notifier.close()
            assert sock.poll() == ["READY=1", "STOPPING=1"]

    def test_an_abstract_socket_receives_the_state(self) -> None:
        """"@name" is the abstract namespace, as systemd spells it."""
        with NotifySocket.abstract() as sock:
            notifier = Notifier(sock.address, structlog.get_logger())
            try:
                notifier.send("WATCHDOG=1")
            finally:
                notifier.close()
            assert sock.poll() == ["WATCHDOG=1"]

    def test_without_notify_socket_nothing_is_sent(self) -> None:
        """No NOTIFY_SOCKET: sending is a no-op that does not raise."""
        notifier = Notifier(None, structlog.get_logger())
        notifier.send("READY=1")
        notifier.close()

    def test_a_vanished_socket_is_logged_never_raised(self) -> None:
        """When the socket is gone, send logs a warning and the daemon goes on."""
        sock = NotifySocket.abstract()
        notifier = Notifier(sock.address, structlog.get_logger())
        sock.close()
        with capture_logs() as logs:
            notifier.send("READY=1")
        notifier.close()
        notifier.close()  # closing twice is harmless
        (failed,) = logs
        assert failed["event"] == "systemd.notify_failed" and failed["state"] == "READY=1"


class TestWatchdogInterval:
    def test_half_of_watchdog_usec(self) -> None:
        """The ping interval is half the watchdog timeout, in seconds."""
        assert watchdog_interval_s({"WATCHDOG_USEC": "2000000"}) == 1.0

    def test_watchdog_pid_must_be_ours_when_present(self) -> None:
        """WATCHDOG_PID naming another process turns the watchdog off for us; our own pid keeps it on."""
        assert watchdog_interval_s({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}) == 1.0
        assert watchdog_interval_s({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid() + 1)}) is None

    def test_absent_zero_or_garbage_means_no_watchdog(self) -> None:
        """No WATCHDOG_USEC, 0, or a value that is not a number: no pings."""
        for env in ({}, {"WATCHDOG_USEC": "0"}, {"WATCHDOG_USEC": "soon"}, {"WATCHDOG_USEC": ""}):
            assert watchdog_interval_s(env) is None, env


class TestRunUnderSystemd:
    async def test_ready_once_after_the_handshakes_then_stopping_on_sigterm(self, tmp_path) -> None:
        """READY=1 comes once, after every connector's handshake; SIGTERM brings STOPPING=1 and exit 0."""
        config = write_config(tmp_path, [chat("a", tmp_path), chat("b", tmp_path)])
        with NotifySocket.abstract() as sock:
            async with daemon(config, tmp_path, env={"NOTIFY_SOCKET": sock.address}) as run:
                await sock.wait("READY=1")
                # The log is written by a thread of its own, so its lines may reach the file after the datagram:
                # await host.ready (logged with READY=1), then both handshakes must come before it in the log.
                await run.wait_event("host.ready")
                names = [e.get("event") for e in run.lines()]
                ready_at = names.index("host.ready")
                assert {e["connector"] for e in run.lines()[:ready_at] if e.get("event") == "connector.ready"} == {
                    "a", "b"}
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
            # And no WATCHDOG=1 without WATCHDOG_USEC; STATUS= lines (the connectors by state) come between.
            assert [m for m in sock.poll() if not m.startswith("STATUS=")] == ["READY=1", "STOPPING=1"]

    async def test_a_filesystem_notify_socket_works_too(self) -> None:
        """NOTIFY_SOCKET as a path (not "@name") gets READY=1 and STOPPING=1 as well."""
        with tempfile.TemporaryDirectory(dir="/tmp") as name:  # short: socket paths are limited to 107 bytes
            folder = Path(name)
            config = write_config(folder, [chat("a", folder)])
            with NotifySocket(str(folder / "notify")) as sock:
                async with daemon(config, folder, env={"NOTIFY_SOCKET": sock.address}) as run:
                    await sock.wait("READY=1")
                    run.signal(signal.SIGINT)
                    assert await run.wait() == 0
                await sock.wait("STOPPING=1")

    async def test_a_connector_that_never_answers_delays_ready_until_its_timeout(self, tmp_path) -> None:
        """READY=1 waits for a silent initialize until that connector's request_timeout_s, and no longer."""
        timeout = 2.0
        config = write_config(tmp_path, [
            chat("quick", tmp_path),
            scripted_connector("mute", {"initialize": "ignore"}, tmp_path, request_timeout_s=timeout),
        ])
        with NotifySocket.abstract() as sock:
            async with daemon(config, tmp_path, env={"NOTIFY_SOCKET": sock.address}) as run:
                ready = await sock.wait("READY=1")
                assert run.events("connector.handshake_failed", connector="mute")
                assert run.events("connector.ready", connector="quick")
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
        waited = ready - first_start(tmp_path, "mute")
        assert timeout - 0.5 <= waited < timeout + SLACK_S

    async def test_crash_looping_and_unspawnable_connectors_do_not_block_ready(self, tmp_path) -> None:
        """A connector that dies at once, and one whose program cannot be executed, count as given up for READY."""
        looping = {"policy": "always", "backoff_initial_s": 0.05, "backoff_max_s": 0.2, "burst": 3, "window_s": 5}
        # check-config finds the file executable; exec fails at run time, as when an interpreter was removed.
        (tmp_path / "missing").write_text("#!/nonexistent/interpreter\n", encoding="utf-8")
        (tmp_path / "missing").chmod(0o755)
        config = write_config(tmp_path, [
            scripted_connector("looper", {"after": "start", "steps": [{"exit": 1}]}, tmp_path, restart=looping,
                               request_timeout_s=30),
            {"name": "ghost", "command": [str(tmp_path / "missing")], "restart": looping, "request_timeout_s": 30},
            chat("quick", tmp_path),
        ])
        with NotifySocket.abstract() as sock:
            async with daemon(config, tmp_path, env={"NOTIFY_SOCKET": sock.address}) as run:
                ready = await sock.wait("READY=1", timeout=20)
                assert ready - first_start(tmp_path, "looper") < SLACK_S  # far below request_timeout_s
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
            assert sock.poll().count("READY=1") == 1

    async def test_watchdog_pings_when_watchdog_usec_is_set_for_this_pid(self, tmp_path) -> None:
        """WATCHDOG_USEC with WATCHDOG_PID equal to the daemon's pid: WATCHDOG=1 every half period."""
        config = write_config(tmp_path)
        # `exec` keeps the shell's pid, so $$ is the daemon's own pid.
        run_command = shlex.join([PYTHON, "-m", "mcplhost", "run", "--config", str(config)])
        command = ["sh", "-c", f"WATCHDOG_PID=$$ exec {run_command}"]
        with NotifySocket.abstract() as sock:
            async with daemon(None, tmp_path, command=command,
                              env={"NOTIFY_SOCKET": sock.address, "WATCHDOG_USEC": "200000"}) as run:
                await sock.wait("READY=1")
                await wait_for(lambda: sock.poll().count("WATCHDOG=1") >= 3, timeout=10)
                # The first ping goes out as the host starts, before READY=1 (host.py starts the watchdog
                # first): the test below counts on it.
                assert sock.poll().index("WATCHDOG=1") < sock.poll().index("READY=1")
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0

    async def test_no_watchdog_pings_when_watchdog_pid_is_another_process(self, tmp_path) -> None:
        """WATCHDOG_PID naming someone else (an inherited variable) means the watchdog is not ours."""
        config = write_config(tmp_path)
        env = {"NOTIFY_SOCKET": "", "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"}
        with NotifySocket.abstract() as sock:
            env["NOTIFY_SOCKET"] = sock.address
            async with daemon(config, tmp_path, env=env) as run:
                await sock.wait("READY=1")
                # A watchdog that is on pings before READY=1 (the test above): none came, so none is on.
                assert "WATCHDOG=1" not in sock.poll()
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
            assert "WATCHDOG=1" not in sock.poll()

    async def test_the_pings_stop_while_the_loop_is_held_and_resume_after(self, tmp_path) -> None:
        """A task blocks the daemon's event loop in time.sleep (tests/cli/held_loop.py): no WATCHDOG=1 is sent
        while it holds, and the pings come back after.

        The daemon's launcher records when the loop was held and when each notification went out, so the
        test asserts on that record once the hold is over. WATCHDOG_PID is unset here, which counts as ours
        (systemd's rule).
        """
        config = write_config(tmp_path)
        hold = tmp_path / "hold"
        interval_s = HELD_WATCHDOG_USEC / 2_000_000
        command = [PYTHON, "-m", "tests.cli.held_loop", "run", "--config", str(config)]
        with NotifySocket.abstract() as sock:
            env = {"NOTIFY_SOCKET": sock.address, "WATCHDOG_USEC": str(HELD_WATCHDOG_USEC),
                   HELD_LOOP_FILE: str(hold), HELD_LOOP_S: str(HELD_INTERVALS * interval_s)}
            async with daemon(None, tmp_path, command=command, env=env) as run:
                await sock.wait("READY=1")
                await wait_for(lambda: sock.poll().count("WATCHDOG=1") >= 2, interval=0.005)
                hold.touch()
                await wait_for(held_record(hold).exists, interval=0.005)  # the hold is over
                start, end = map(float, held_record(hold).read_text(encoding="utf-8").split())
                await wait_for(lambda: len([t for t, state in sent(hold) if state == "WATCHDOG=1" and t > end]) >= 2,
                               interval=0.005)
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
            received = sock.poll().count("WATCHDOG=1")
        pings = [t for t, state in sent(hold) if state == "WATCHDOG=1"]
        assert received == len(pings)  # the record is what the socket got
        assert end - start >= HELD_INTERVALS * interval_s
        assert [t for t in pings if start <= t <= end] == [], "a WATCHDOG=1 went out while the loop was held"
        assert len([t for t in pings if t < start]) >= 2 and len([t for t in pings if t > end]) >= 2
