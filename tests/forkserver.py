"""A fork server for the suite's `mcplhost run` daemons: one per test process, with the package already loaded.

    process = forked(["run", "--config", str(path)], env=cli_env(), cwd=REPO, stderr=log_path)
    process.send_signal(signal.SIGTERM)
    assert await process.wait() == 0

The suite starts about a hundred daemons, and on the 2-core machines it runs
on loading the interpreter and the package is most of each start: about half
a second of CPU, of a start and stop's ~0.8. The server (this module run as
`python -m tests.forkserver SOCKET`) loads what `mcplhost run` loads once;
each daemon is then a fork of it that takes its own argv, environment, working
folder, umask and standard streams and calls the command's own entry point
(mcplhost/__main__.py `main`), so it is a process of its own that a test signals,
kills and waits for by pid as it would a spawned one. What a fork does not
show, the start of the interpreter and the import under a Ctrl-C, is tested
with real `python -m mcplhost` processes (tests/cli/test_run.py TestSignals,
tests/cli/test_dev.py, the README and install tests).

The server forks only from its single thread, before the child starts any
loop or thread of its own. It ends, killing what it forked and has not seen
end, when the test process that started it closes its stdin (or dies).
"""

from __future__ import annotations

import atexit
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio
import msgspec

REPO = Path(__file__).resolve().parents[1]
class Spawn(msgspec.Struct, frozen=True):
    """One daemon to fork: its argv after `mcplhost`, environment, folder, umask (-1: the server's) and the
    files its stdout and stderr go to (None: /dev/null); stdin is /dev/null."""

    args: list[str]
    env: dict[str, str]
    cwd: str
    umask: int = -1
    stdout: str | None = None
    stderr: str | None = None


#: How long a spawn request may wait for the server's answer (a busy machine delays the fork, never by this much).
SPAWN_TIMEOUT_S = 60.0


# --- the server (its own process) ----------------------------------------------------


def serve(path: str) -> Spawn:
    """Answer spawn requests on the Unix socket at `path` until stdin ends; returns only in a forked child,
    with that child's request."""
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]  # as mcplhost/__main__.py refuses it
    import anyio._backends._asyncio  # noqa: F401  # what `run` loads, loaded once (anyio's backend at its start)

    import mcplhost.__main__  # noqa: F401
    import mcplhost.cli
    import mcplhost.cli.serve
    import mcplhost.dev  # noqa: F401  # the bundled connectors' table, read by run's config checks
    import mcplhost.host  # noqa: F401

    try:  # the model SDK the suite's daemons use (~1.3 s of CPU a load), where the extra is installed
        import openai  # noqa: F401
    except ImportError:
        pass

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup descriptor hears of each child's end
    signal.set_wakeup_fd(wake_write)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "spawn")
    selector.register(wake_read, selectors.EVENT_READ, "reap")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    waiting: dict[int, socket.socket] = {}  # pid -> the connection its exit status goes to
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "spawn":
                conn, _ = listener.accept()
                request = msgspec.json.decode(_read_line(conn), type=Spawn)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    for other in (listener, conn, *waiting.values()):
                        other.close()
                    os.close(wake_read)
                    os.close(wake_write)
                    return request
                conn.sendall(f"{pid}\n".encode())
                waiting[pid] = conn
            elif key.data == "reap":
                try:
                    while os.read(wake_read, 512):
                        pass
                except BlockingIOError:
                    pass
                _reap(waiting)
            else:  # the test process closed our stdin or ended
                if os.read(sys.stdin.fileno(), 512):
                    continue
                for pid in waiting:
                    _kill(pid)
                raise SystemExit(0)


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass  # the test went away without waiting
            conn.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_line(conn: socket.socket, size: int = 65536) -> bytes:
    """One line from `conn`, read `size` bytes at a time (1: nothing past the line is taken)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(size)
        if not chunk:
            raise ConnectionError("the connection ended before its line did")
        data += chunk
    return data


def become(request: Spawn) -> None:
    """In a forked child: take the request's streams, folder, umask, environment and argv, then run the command."""
    stdin = os.open(os.devnull, os.O_RDONLY)
    stdout = os.open(request.stdout or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    stderr = os.open(request.stderr or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request.cwd)
    if request.umask >= 0:
        os.umask(request.umask)
    os.environ.clear()
    os.environ.update(request.env)
    from mcplhost import __main__ as command

    sys.argv = [command.__file__, *request.args]
    raise SystemExit(command.main())


# --- the client (in the test process) ------------------------------------------------


class ForkedProcess:
    """A daemon forked by the server: signalled and killed by pid, its exit status read from the server."""

    def __init__(self, pid: int, status: socket.socket) -> None:
        self.pid = pid
        self._status = status
        self._returncode: int | None = None

    @property
    def returncode(self) -> int | None:
        """The exit code (negative: the signal that ended it) once it has ended, else None; does not block."""
        if self._returncode is None:
            try:
                data = self._status.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            if not data:
                raise RuntimeError(f"the fork server ended before daemon {self.pid} did (or said how)")
            if data.endswith(b"\n"):
                self._returncode = int(self._status.recv(64))
        return self._returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass  # ended and reaped, its status on the way: nothing left to signal

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def wait(self) -> int:
        while self.returncode is None:
            await anyio.wait_readable(self._status)
        assert self._returncode is not None
        return self._returncode

    async def aclose(self) -> None:
        self._status.close()


class ForkServer:
    """The server process of this test process, started on first use."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="mcplhost-forks-")
        self.path = os.path.join(self._folder.name, "socket")
        self._process = subprocess.Popen([sys.executable, "-m", "tests.forkserver", self.path], cwd=REPO,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._process.stdout is not None
        line = self._process.stdout.readline()  # bounded by the suite's per-test timeout
        if line != b"ready\n":
            raise RuntimeError(f"the fork server did not start (it said {line!r}, exit {self._process.poll()})")

    def spawn(self, args: Sequence[str], *, env: Mapping[str, str], cwd: Path, stderr: Path | None = None,
              stdout: Path | None = None, umask: int = -1) -> ForkedProcess:
        """Fork one daemon; blocks the caller briefly (the server forks as soon as it has read the request and
        answers with the pid)."""
        for path in (stderr, stdout):
            if path is not None:
                path.write_bytes(b"")  # there (and empty) before the child starts, as a spawn's redirection is
        request = Spawn(list(args), dict(env), str(cwd), umask, str(stdout) if stdout else None,
                        str(stderr) if stderr else None)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(SPAWN_TIMEOUT_S)
            conn.connect(self.path)
            conn.sendall(msgspec.json.encode(request) + b"\n")
            pid = int(_read_line(conn, 1))  # byte by byte: the exit status may follow at once
        except BaseException:
            conn.close()
            raise
        conn.setblocking(False)
        return ForkedProcess(pid, conn)

    def stop(self) -> None:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.close()
        self._process.wait(timeout=30)
        self._process.stdout.close()
        self._folder.cleanup()


_server: ForkServer | None = None


def forked(args: Sequence[str], *, env: Mapping[str, str], cwd: Path, stderr: Path | None = None,
           stdout: Path | None = None, umask: int = -1) -> ForkedProcess:
    """`mcplhost ARGS` forked from this test process's server (started on first use, stopped at exit)."""
    global _server
    if _server is None:
        _server = ForkServer()
        atexit.register(_server.stop)
    return _server.spawn(args, env=env, cwd=cwd, stderr=stderr, stdout=stdout, umask=umask)


if __name__ == "__main__":
    become(serve(sys.argv[1]))
