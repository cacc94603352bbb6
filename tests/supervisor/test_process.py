"""The child process layer: environment, spawn, the shutdown ladder and the stderr drain, with real children."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
import structlog
from anyio.abc import Process
from structlog.testing import capture_logs

from mcplhost.config import ConnectorConfig
from mcplhost.envfile import EnvFileError
from mcplhost.supervisor.process import (
    DIES_WITH_PARENT,
    HOST_ONLY_ENV,
    INHERITED_ENV,
    STDERR_LINE_CHARS,
    STDERR_LINES_PER_S,
    child_environment,
    drain_stderr,
    exit_description,
    launch_command,
    spawn,
    stop,
)

from ..harness import PYTHON, alive, wait_for

#: Slack on top of a configured grace period for scheduling and process exit on a busy machine.
SLACK_S = 1.5


def child(source: str) -> list[str]:
    return [PYTHON, "-c", textwrap.dedent(source)]


#: Says "ready" once its signal handling is set up, then waits forever on stdin's EOF and SIGTERM.
STUBBORN = child("""
    import signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    sys.stdin.read()
    while True:
        time.sleep(1)
""")
#: Ignores stdin's end but dies of SIGTERM.
IGNORES_EOF = child("""
    import sys, time
    print("ready", flush=True)
    sys.stdin.read()
    while True:
        time.sleep(1)
""")
#: Exits as soon as stdin ends.
POLITE = child("""
    import sys
    print("ready", flush=True)
    sys.stdin.read()
""")


@asynccontextmanager
async def started(command: list[str]) -> AsyncIterator[Process]:
    """A spawned child that has printed "ready"; stopped hard afterwards whatever the test did."""
    process = await spawn(command, env=child_environment(connector()), cwd=None)
    try:
        assert process.stdout is not None
        with anyio.fail_after(10):
            assert (await process.stdout.receive()).startswith(b"ready")
        yield process
    finally:
        await stop(process, stdin_grace=0, term_grace=0, log=structlog.get_logger())



class TestExitDescription:
    def test_an_exit_code_and_a_signal_read_as_people_say_them(self) -> None:
        """A code reads "exited with code N", a negative return code names the signal."""
        assert exit_description(3) == "exited with code 3"
        assert exit_description(0) == "exited with code 0"
        assert exit_description(-signal.SIGKILL) == "was killed by signal 9 (SIGKILL)"
        assert exit_description(None) == "is still running"


def connector(**fields: object) -> ConnectorConfig:
    return ConnectorConfig(name="c", command=["true"], **fields)  # type: ignore[arg-type]


def env_file(folder: Path, text: str, mode: int = 0o600) -> str:
    path = folder / "c.env"
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return str(path)


#: A host environment with a bit of everything: basics, locale, systemd's, secrets, the host's api key.
HOST = {"PATH": "/bin", "HOME": "/home/h", "LANG": "C.UTF-8", "LC_TIME": "de_DE", "TZ": "UTC", "USER": "h",
        "LOGNAME": "h", "SHELL": "/bin/sh", "TERM": "xterm", "TMPDIR": "/tmp/h",
        "NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "100", "WATCHDOG_PID": "1",
        "OPENAI_API_KEY": "sk-host", "ZULIP_TOKEN": "other-connector", "PYTHONPATH": "/src", "PROXY": "http://p"}


class TestChildEnvironment:
    def test_only_the_allowlist_is_inherited(self) -> None:
        """PATH, HOME, LANG, LC_*, TZ, USER, LOGNAME, SHELL, TERM, TMPDIR pass; secrets and systemd's do not."""
        env = child_environment(connector(), HOST)
        assert set(env) == {"PATH", "HOME", "LANG", "LC_TIME", "TZ", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR"}
        assert set(env) <= INHERITED_ENV | {"LC_TIME"} and not set(HOST_ONLY_ENV) & set(env)

    def test_env_pass_names_host_variables_and_env_adds_its_own(self) -> None:
        """`env_pass` copies the named host variables (an unset one is skipped); `env` adds the connector's."""
        env = child_environment(connector(env_pass=["PROXY", "UNSET_HERE"], env={"GUILDS": "acme"}), HOST)
        assert env["PROXY"] == "http://p" and env["GUILDS"] == "acme" and "UNSET_HERE" not in env

    def test_the_env_file_is_read_at_each_call_and_env_wins(self, tmp_path) -> None:
        """The file is read when the child starts (an edit counts next time); precedence: env > file > pass."""
        spec = connector(env_file=env_file(tmp_path, "TOKEN=one\nPROXY=file\n"), env_pass=["PROXY"],
                         env={"LANG": "C"})
        first = child_environment(spec, HOST)
        assert (first["TOKEN"], first["PROXY"], first["LANG"]) == ("one", "file", "C")
        env_file(tmp_path, "TOKEN=two\n")
        assert child_environment(spec, HOST)["TOKEN"] == "two"

    def test_systemd_variables_never_get_through_even_when_named(self, tmp_path) -> None:
        """NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID are the host's: dropped from env_pass, env and env_file alike."""
        named = list(HOST_ONLY_ENV)
        spec = connector(env_pass=named, env={name: "x" for name in named},
                         env_file=env_file(tmp_path, "".join(f"{name}=y\n" for name in named)))
        assert not set(HOST_ONLY_ENV) & set(child_environment(spec, HOST))
        assert set(HOST_ONLY_ENV) == {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}

    def test_withheld_api_key_variables_never_get_through(self, tmp_path) -> None:
        """A variable named by an api_key_env is dropped even when env or env_pass names it (check-config refuses)."""
        spec = connector(env_pass=["OPENAI_API_KEY"], env={"OPENAI_API_KEY": "x"},
                         withheld_env=frozenset({"OPENAI_API_KEY"}))
        assert "OPENAI_API_KEY" not in child_environment(spec, HOST)

    def test_an_env_file_setting_a_withheld_variable_is_refused(self, tmp_path) -> None:
        """The file is the operator's, read at each start: naming an api key variable there fails the spawn."""
        spec = connector(env_file=env_file(tmp_path, "OPENAI_API_KEY=sk\n"), withheld_env=frozenset({"OPENAI_API_KEY"}))
        with pytest.raises(EnvFileError, match="OPENAI_API_KEY"):
            child_environment(spec, HOST)

    @pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o666])
    def test_an_env_file_others_may_read_or_write_is_refused(self, tmp_path, mode: int) -> None:
        """Group or other read/write permission on the env file: refused, naming the mode and the fix."""
        spec = connector(env_file=env_file(tmp_path, "TOKEN=x\n", mode))
        with pytest.raises(EnvFileError, match=f"mode {mode:04o}.*chmod 600"):
            child_environment(spec, HOST)

    def test_the_base_defaults_to_the_host_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without a base the host's own environment is read, through the same allowlist."""
        monkeypatch.setenv("MCPLHOST_TEST_MARK", "1")
        monkeypatch.setenv("TZ", "Europe/Berlin")
        env = child_environment(connector())
        assert env["TZ"] == "Europe/Berlin" and "MCPLHOST_TEST_MARK" not in env


class TestSpawn:
    async def test_a_missing_command_raises_oserror(self, tmp_path) -> None:
        """A command that does not exist fails at spawn with an OSError the supervisor can log."""
        with pytest.raises(FileNotFoundError):
            await spawn([str(tmp_path / "no-such-connector")], env=child_environment(connector()), cwd=None)

    @pytest.mark.parametrize(("program", "error"), [("no-such-connector-h4", FileNotFoundError),
                                                    ("./not-executable", PermissionError),
                                                    ("./absent", FileNotFoundError),
                                                    ("./bad-interpreter", FileNotFoundError)])
    async def test_a_command_exec_could_not_run_fails_the_spawn_itself(self, tmp_path, program: str,
                                                                       error: type[OSError]) -> None:
        """Exec's own error (the launcher reports it back), so the supervisor logs spawn_failed, not a crash."""
        (tmp_path / "not-executable").write_text("#!/bin/sh\n", encoding="utf-8")
        (tmp_path / "bad-interpreter").write_text("#!/nonexistent/interpreter\n", encoding="utf-8")
        (tmp_path / "bad-interpreter").chmod(0o755)
        with pytest.raises(error):
            await spawn([program], env=child_environment(connector()), cwd=str(tmp_path))

    async def test_a_missing_cwd_fails_the_spawn(self, tmp_path) -> None:
        """A cwd that is not there is an OSError at spawn, naming it."""
        with pytest.raises(FileNotFoundError, match="gone"):
            await spawn(POLITE, env=child_environment(connector()), cwd=str(tmp_path / "gone"))

    async def test_the_launcher_becomes_the_connector(self) -> None:
        """The die-with-parent launcher execs the command: same pid, the connector's own argv."""
        command = child("""
            import os
            print(os.getpid(), open(f"/proc/{os.getpid()}/cmdline").read().split(chr(0))[1], flush=True)
        """)
        process = await spawn(command, env=child_environment(connector()), cwd=None)
        try:
            assert process.stdout is not None
            output = b""
            with anyio.fail_after(10):
                while not output.endswith(b"\n"):
                    output += await process.stdout.receive()
            assert output.decode().split() == [str(process.pid), "-c"]
        finally:
            await stop(process, stdin_grace=0, term_grace=0, log=structlog.get_logger())
        assert launch_command(["x"], host_pid=1, report_fd=5)[-3:] == ["1", "5", "x"]
        assert DIES_WITH_PARENT == sys.platform.startswith("linux")

    async def test_the_child_leads_its_own_session(self) -> None:
        """A child starts in its own session, so its whole process group can be signalled."""
        async with started(POLITE) as process:
            assert os.getsid(process.pid) == process.pid


class TestStop:
    async def test_a_child_that_exits_on_eof_just_exits(self) -> None:
        """Closing stdin is enough for a well-behaved child, long before the grace period ends."""
        async with started(POLITE) as process:
            began = time.monotonic()
            how = await stop(process, stdin_grace=5, term_grace=5, log=structlog.get_logger())
            assert how == "exited" and process.returncode == 0
            assert time.monotonic() - began < 5

    async def test_a_child_that_ignores_eof_gets_sigterm_after_the_grace(self) -> None:
        """After stop_grace_s a child still running is sent SIGTERM, and dies of it."""
        async with started(IGNORES_EOF) as process:
            began = time.monotonic()
            how = await stop(process, stdin_grace=0.3, term_grace=5, log=structlog.get_logger())
            elapsed = time.monotonic() - began
            assert how == "terminated" and process.returncode == -signal.SIGTERM
            assert 0.3 <= elapsed < 0.3 + SLACK_S

    async def test_a_child_that_ignores_eof_and_sigterm_is_killed_within_the_bounds(self) -> None:
        """stop_grace_s, then SIGTERM, then term_grace_s, then SIGKILL, with a warning naming the connector."""
        with capture_logs() as logs:
            async with started(STUBBORN) as process:
                began = time.monotonic()
                how = await stop(process, stdin_grace=0.2, term_grace=0.3,
                                 log=structlog.get_logger().bind(connector="stubborn"))
                elapsed = time.monotonic() - began
        assert how == "killed" and process.returncode == -signal.SIGKILL
        assert 0.5 <= elapsed < 0.5 + SLACK_S
        (kill,) = [e for e in logs if e["event"] == "connector.kill"]
        assert kill["connector"] == "stubborn" and kill["log_level"] == "warning"

    async def test_the_ladder_finishes_when_its_caller_is_cancelled(self) -> None:
        """A cancelled caller (host shutdown) still sees the child through to its end: the ladder is shielded."""
        async with started(STUBBORN) as process:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await stop(process, stdin_grace=0.1, term_grace=0.1, log=structlog.get_logger())
            assert process.returncode == -signal.SIGKILL

    async def test_what_the_child_left_in_its_group_is_killed_too(self, tmp_path) -> None:
        """A grandchild that keeps running after the child exits goes with it."""
        pidfile = tmp_path / "grandchild.pid"
        forks = child(f"""
            import subprocess, sys, time
            quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], **quiet)
            open({str(pidfile)!r}, "w").write(str(grandchild.pid))
            print("ready", flush=True)
            sys.stdin.read()
        """)
        async with started(forks) as process:
            grandchild = int(pidfile.read_text())
            assert alive(grandchild)
            assert await stop(process, stdin_grace=2, term_grace=2, log=structlog.get_logger()) == "exited"
        with anyio.fail_after(5):
            while alive(grandchild):
                await anyio.sleep(0.02)


class TestDrainStderr:
    async def test_megabytes_of_stderr_neither_block_the_child_nor_flood_the_log(self) -> None:
        """8 MB of stderr drains promptly; lines are logged at a bounded rate and the rest are counted."""
        lines = 80_000
        chatty = child(f"""
            import sys
            sys.stderr.write(("x" * 99 + "\\n") * {lines})
            sys.stderr.flush()
            print("done", flush=True)
        """)
        process = await spawn(chatty, env=child_environment(connector()), cwd=None)
        began = time.monotonic()
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(drain_stderr, process, structlog.get_logger().bind(connector="chatty", stream="stderr"))
                assert process.stdout is not None
                with anyio.fail_after(20):
                    assert (await process.stdout.receive()).startswith(b"done")
            elapsed = time.monotonic() - began
            await stop(process, stdin_grace=1, term_grace=1, log=structlog.get_logger())
        logged = [e for e in logs if e["event"] == "connector.stderr"]
        dropped = sum(e["lines"] for e in logs if e["event"] == "connector.stderr_dropped")
        assert len(logged) + dropped == lines
        assert len(logged) <= STDERR_LINES_PER_S * (int(elapsed) + 1)
        assert all(e["connector"] == "chatty" and e["stream"] == "stderr" for e in logged)

    async def test_a_long_line_is_cut(self) -> None:
        """A stderr line longer than STDERR_LINE_CHARS is logged cut, and says so."""
        noisy = child(f"""
            import sys
            sys.stderr.write("y" * {STDERR_LINE_CHARS * 3} + "\\nshort\\n")
        """)
        process = await spawn(noisy, env=child_environment(connector()), cwd=None)
        with capture_logs() as logs:
            with anyio.fail_after(10):
                await drain_stderr(process, structlog.get_logger())
            await stop(process, stdin_grace=1, term_grace=1, log=structlog.get_logger())
        long, short = [e for e in logs if e["event"] == "connector.stderr"]
        assert len(long["line"]) == STDERR_LINE_CHARS and long["cut"] is True
        assert short["line"] == "short" and short["cut"] is False

    async def test_lines_dropped_before_a_cancelled_drain_are_still_counted(self) -> None:
        """When the host cancels the drain (a stop) the lines it read but did not log are reported."""
        lines, size = 20_000, 10
        burst = child(f"""
            import sys, time
            sys.stderr.write(("z" * {size - 1} + "\\n") * {lines})
            sys.stderr.flush()
            print("done", flush=True)
            time.sleep(60)
        """)
        process = await spawn(burst, env=child_environment(connector()), cwd=None)
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(drain_stderr, process, structlog.get_logger())
                assert process.stdout is not None
                with anyio.fail_after(20):
                    assert (await process.stdout.receive()).startswith(b"done")
                tg.cancel_scope.cancel()
            await stop(process, stdin_grace=0, term_grace=1, log=structlog.get_logger())
        logged = len([e for e in logs if e["event"] == "connector.stderr"])
        dropped = sum(e["lines"] for e in logs if e["event"] == "connector.stderr_dropped")
        unread = 65536 // size  # at most a pipe's buffer was still unread when the drain stopped
        assert lines - unread <= logged + dropped <= lines

    async def test_dropped_lines_are_reported_when_the_window_ends_even_if_the_child_goes_quiet(self) -> None:
        """A burst followed by silence is summed up about a second later, not at the end of the child's life."""
        burst = child(f"""
            import sys, time
            sys.stderr.write("w\\n" * {STDERR_LINES_PER_S + 150})
            sys.stderr.flush()
            time.sleep(60)
        """)
        process = await spawn(burst, env=child_environment(connector()), cwd=None)
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(drain_stderr, process, structlog.get_logger())
                await wait_for(lambda: [e for e in logs if e["event"] == "connector.stderr_dropped"], timeout=5)
                tg.cancel_scope.cancel()
            await stop(process, stdin_grace=0, term_grace=1, log=structlog.get_logger())
        (summary,) = [e for e in logs if e["event"] == "connector.stderr_dropped"]
        assert summary["lines"] == 150
