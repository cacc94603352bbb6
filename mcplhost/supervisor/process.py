"""A connector's child process: environment, spawn, stderr drain, shutdown ladder.

Shutdown follows MCP's stdio convention: close the child's stdin, allow a
grace period, SIGTERM its process group, wait again, SIGKILL. Every wait is
bounded and runs shielded, so a cancelled host still cleans up its children.
We poll `returncode` instead of awaiting `wait()`: a grandchild that keeps
the pipes open must not make a dead child look alive.
"""

from __future__ import annotations

import errno
import math
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import anyio
from anyio.abc import Process

from mcplhost.config import ConnectorConfig
from mcplhost.envfile import EnvFileError, read_env_file

from .children import CHILD_RECORD

#: What a child gets of the host's environment without asking (docs/connectors.md §10): the
#: basics a program needs to run and to speak the user's language, nothing that could be a secret.
INHERITED_ENV = frozenset({"PATH", "HOME", "LANG", "TZ", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR"})
#: Locale variables (LC_ALL, LC_CTYPE, ...) are inherited too.
INHERITED_ENV_PREFIX = "LC_"
#: Variables that belong to the host's own supervisor (systemd), never to a child:
#: a child that inherited NOTIFY_SOCKET could report READY or WATCHDOG for us.
HOST_ONLY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
#: How often a wait for exit looks at the child's return code.
EXIT_POLL_S = 0.02
#: After SIGKILL, how long before we report the child as unkillable.
KILL_WAIT_S = 2.0
#: A stderr line longer than this is cut before it is logged.
STDERR_LINE_CHARS = 2000
#: At most this many stderr lines are logged per second per connector; the rest are counted.
STDERR_LINES_PER_S = 50


def child_environment(spec: ConnectorConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a connector starts with: an allowlist of the host's, plus what is its own.

    In order, later winning: the inherited basics, the host variables named in
    `env_pass`, the `env_file` (read now, so an edit counts at the next
    start), the `env` table. The host's systemd variables and every variable
    named by an `api_key_env` (`spec.withheld_env`) never get through, whatever
    names them. Raises EnvFileError when the env file cannot be used.
    """
    host = os.environ if base is None else base
    env = {k: v for k, v in host.items() if k in INHERITED_ENV or k.startswith(INHERITED_ENV_PREFIX)}
    env.update({name: host[name] for name in spec.env_pass if name in host})
    if spec.env_file is not None:
        own = read_env_file(spec.env_file)
        withheld = sorted(own.keys() & spec.withheld_env)
        if withheld:
            raise EnvFileError(f"{spec.env_file}: sets {', '.join(withheld)}, a variable holding an api key "
                               "of this host (api_key_env); connectors never get those")
        env.update(own)
    env.update(spec.env)
    for key in (*HOST_ONLY_ENV, *spec.withheld_env):
        env.pop(key, None)
    return env


#: prctl(2)'s option that has the kernel signal a process when the thread that forked it ends (Linux).
PR_SET_PDEATHSIG = 1
#: What a connector gets when the host dies without stopping it (kill -9, a crash): it cannot be told
#: anything any more and nobody reads what it says, so it goes at once (docs/operations.md#when-the-host-dies).
PARENT_DEATH_SIGNAL = signal.SIGKILL
#: The child's first instructions, run by this interpreter between fork and the connector's exec:
#: ask for the parent-death signal, make sure the host did not die before it took, then become the
#: connector (same pid and process group, so the shutdown ladder is unchanged). An exec that fails
#: writes its errno to the report pipe; one that succeeds closes it (close-on-exec), as subprocess
#: itself reports. A launcher rather than `preexec_fn`: Python code between fork and exec is unsafe
#: in a process with threads, and anyio's open_process offers no preexec_fn anyway. -I -S keeps it
#: to a few milliseconds.
DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    f"ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, {int(PARENT_DEATH_SIGNAL)}, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "report = int(sys.argv[2])\n"
    "os.set_inheritable(report, False)\n"
    "try:\n"
    "    os.execvp(sys.argv[3], sys.argv[3:])\n"
    "except OSError as exc:\n"
    "    os.write(report, str(exc.errno or 0).encode())\n"
    "    os._exit(127)\n"
)
#: Whether children are started through DIE_WITH_PARENT: prctl is Linux's.
DIES_WITH_PARENT = sys.platform.startswith("linux")
#: An errno is a few digits; more from the report pipe is not the launcher's.
REPORT_MAX_BYTES = 16


def launch_command(command: Sequence[str], *, host_pid: int, report_fd: int) -> list[str]:
    """The argv that starts `command` so that it dies with the host, reporting a failed exec on `report_fd`."""
    return [sys.executable, "-I", "-S", "-c", DIE_WITH_PARENT, str(host_pid), str(report_fd), *command]


async def spawn(command: Sequence[str], *, env: Mapping[str, str], cwd: str | None) -> Process:
    """Start the child in its own session (process group), all three pipes open, dying with the host (Linux).

    The parent-death signal fires when the *thread* that forked the child
    ends, not the process: asyncio forks on the event loop's thread, which
    lives as long as the host, so that is the host's death.
    Raises OSError (e.g. FileNotFoundError) when the command cannot start.
    """
    if not DIES_WITH_PARENT:
        return await _open(list(command), env=env, cwd=cwd)
    report, report_w = os.pipe()
    try:
        process = await _open(launch_command(command, host_pid=os.getpid(), report_fd=report_w), env=env, cwd=cwd,
                              pass_fds=(report_w,))
    except BaseException:
        os.close(report)
        raise
    finally:
        os.close(report_w)
    try:
        await anyio.wait_readable(report)  # end of file once the exec happened, or the launcher's errno
        failed = os.read(report, REPORT_MAX_BYTES)
    except BaseException:  # cancelled while it started: nobody else knows of this child
        _signal_group(process, signal.SIGKILL)
        with anyio.CancelScope(shield=True):
            await process.aclose()
        raise
    finally:
        os.close(report)
    if failed:
        with anyio.CancelScope(shield=True):
            await process.aclose()
        code = int(failed) if failed.isdigit() else errno.ENOEXEC
        raise OSError(code, os.strerror(code), command[0])
    _record(process, running=True)
    return process


def _record(process: Process, *, running: bool) -> None:
    """Keep the daemon's runtime file of connector groups (children.py) in step, when there is one."""
    record = CHILD_RECORD.get()
    if record is not None:
        if running:
            record.add(process.pid)
        else:
            record.remove(process.pid)


async def _open(argv: list[str], *, env: Mapping[str, str], cwd: str | None,
                pass_fds: Sequence[int] = ()) -> Process:
    return await anyio.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=dict(env), cwd=cwd, start_new_session=True, pass_fds=pass_fds)


def exit_description(returncode: int | None) -> str:
    """How a child ended, for people: "exited with code 3", "was killed by signal 9 (SIGKILL)"."""
    if returncode is None:
        return "is still running"
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = f" ({signal.Signals(-returncode).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-returncode}{name}"


async def wait_exited(process: Process, timeout: float) -> bool:
    """Poll until the child has exited, at most `timeout` seconds."""
    with anyio.move_on_after(timeout):
        while process.returncode is None:
            await anyio.sleep(EXIT_POLL_S)
    return process.returncode is not None


def _signal_group(process: Process, sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)  # the child leads its own group (start_new_session)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            process.send_signal(sig)
        except ProcessLookupError:
            pass


async def stop(process: Process, *, stdin_grace: float, term_grace: float, log: Any) -> str:
    """Run the shutdown ladder; return how the child ended."""
    with anyio.CancelScope(shield=True):
        if process.stdin is not None:
            try:
                await process.stdin.aclose()
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
        if await wait_exited(process, stdin_grace):
            how = "exited"
        else:
            _signal_group(process, signal.SIGTERM)
            if await wait_exited(process, term_grace):
                how = "terminated"
            else:
                log.warning("connector.kill", reason="ignored stdin EOF and SIGTERM")
                _signal_group(process, signal.SIGKILL)
                if not await wait_exited(process, KILL_WAIT_S):
                    log.error("connector.unkillable", pid=process.pid)
                    return "unkillable"
                how = "killed"
        # Whatever the child left behind in its group goes too; then the next start need not.
        _signal_group(process, signal.SIGKILL)
        _record(process, running=False)
        await _close_pipes(process)
    return how


class Launcher(Protocol):
    """How a connector's process life begins and ends; `CHILD_PROCESSES` is the host's.

    `spawn` hands back a running `Process` whose pipes the session speaks
    over (raising OSError or EnvFileError when it cannot start); `stop` ends
    it, bounded, and says how ("exited", "terminated", "killed", ...).
    """

    async def spawn(self, spec: ConnectorConfig) -> Process: ...

    async def stop(self, process: Process, spec: ConnectorConfig, log: Any) -> str: ...


class ChildProcesses:
    """Each life a child process: `spawn` above, in the connector's own environment, and the shutdown ladder."""

    async def spawn(self, spec: ConnectorConfig) -> Process:
        return await spawn(spec.command, env=child_environment(spec), cwd=spec.cwd)

    async def stop(self, process: Process, spec: ConnectorConfig, log: Any) -> str:
        return await stop(process, stdin_grace=spec.stop_grace_s, term_grace=spec.term_grace_s, log=log)


#: The launcher of every connector the host runs.
CHILD_PROCESSES = ChildProcesses()


async def _close_pipes(process: Process) -> None:
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            try:
                await stream.aclose()
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass


async def drain_stderr(process: Process, log: Any) -> None:
    """Log the child's stderr line by line, bounded in line length and rate."""
    if process.stderr is None:
        return
    partial = b""
    window_start = anyio.current_time()
    logged = dropped = 0

    def next_window(now: float) -> None:
        nonlocal window_start, logged, dropped
        if dropped:
            log.warning("connector.stderr_dropped", lines=dropped)
        window_start, logged, dropped = now, 0, 0

    def emit(raw: bytes) -> None:
        nonlocal logged, dropped
        now = anyio.current_time()
        if now - window_start >= 1.0:
            next_window(now)
        if logged >= STDERR_LINES_PER_S:
            dropped += 1
            return
        logged += 1
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if text:
            log.info("connector.stderr", line=text[:STDERR_LINE_CHARS], cut=len(text) > STDERR_LINE_CHARS)

    try:
        try:
            while True:
                now = anyio.current_time()
                if dropped and now - window_start >= 1.0:
                    next_window(now)
                # With lines dropped, read only until the window ends, so a burst followed by
                # silence is still summed up about a second later, not when the child exits.
                chunk = None
                with anyio.CancelScope(deadline=window_start + 1.0 if dropped else math.inf):
                    chunk = await process.stderr.receive()
                if chunk is None:
                    continue
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                if len(partial) > STDERR_LINE_CHARS * 4:  # a line with no end: log what we have
                    lines.append(partial)
                    partial = b""
                for line in lines:
                    emit(line)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        if partial:
            emit(partial)
    finally:
        # However the drain ends, the child's end or the host cancelling it, report what was not logged.
        if dropped:
            log.warning("connector.stderr_dropped", lines=dropped)
