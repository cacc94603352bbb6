"""An in-memory connection pair: the host's real connection against the scripted connector, in this process.

    async with memory_host(config_with(tmp_path, scripted("disc", script, tmp_path))) as host:
        await wait_for(lambda: record(tmp_path, "disc").done)

`MemoryLauncher` is a `Launcher` (mcplhost/supervisor/process.py): a
connector whose command runs tests/scripted_connector.py plays its script in
the test's own event loop, over memory streams instead of a child's pipes, so
the supervisor, the session (rpc/session.py), the `McplConnection` and
everything behind it are the host's own while no process starts. The script,
its record file and what the host answers are the same as with a real child;
what only a process has stays with real children (tests/e2e, the
supervisor's tests): signals, stderr floods, a pipe's buffer, exec failures.
Any other command (a bundled stub, a `sys.executable -c` child) is spawned for
real, so one host may mix both.

The peer's "process": `exit` ends it at once with its code (as os._exit:
nothing more is written), closing stdin ends its read loop (code 0, unless
the script ignores EOF), `terminate` cancels it (-SIGTERM, unless the script
ignores SIGTERM) and `kill` always does (-SIGKILL). Its pid is above Linux's
largest, so it never names a real process.
"""

from __future__ import annotations

import itertools
import json
import math
import signal
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process, TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from mcplhost.config import Config, ConnectorConfig
from mcplhost.host import Host
from mcplhost.supervisor.process import CHILD_PROCESSES, child_environment

from .harness import connected, running_host
from .scripted_connector import MODULE, load_script, scripted_server

#: Linux's largest pid is 2**22: from here on no pid is a real process's.
FIRST_PID = 2**22 + 1
_pids = itertools.count(FIRST_PID)

#: What a test may set off on each chunk the host reads from a peer: `fault(connector, chunk)` (it may raise).
Fault = Callable[[str, bytes], None]


class _Sender(ByteSendStream):
    """The writing end of a one-way byte pipe; the peer's own writes never wait (`write`)."""

    def __init__(self, stream: MemoryObjectSendStream[bytes]) -> None:
        self._stream = stream

    async def send(self, item: bytes) -> None:
        await self._stream.send(bytes(item))

    def write(self, data: bytes) -> None:
        """Write now; to a reader that is gone, the bytes go nowhere (as to a dead pipe)."""
        try:
            self._stream.send_nowait(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    async def aclose(self) -> None:
        self._stream.close()

    def close(self) -> None:
        self._stream.close()


class _Receiver(ByteReceiveStream):
    """The reading end of a one-way byte pipe: at most `max_bytes` at a time, EndOfStream once the writer closed."""

    def __init__(self, stream: MemoryObjectReceiveStream[bytes], fault: Callable[[bytes], None] | None = None) -> None:
        self._stream = stream
        self._rest = b""
        self._fault = fault

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._rest:
            self._rest = await self._stream.receive()
            if self._fault is not None:
                self._fault(self._rest)
        chunk, self._rest = self._rest[:max_bytes], self._rest[max_bytes:]
        return chunk

    async def aclose(self) -> None:
        self._stream.close()

    def close(self) -> None:
        self._stream.close()


def _pipe(fault: Callable[[bytes], None] | None = None) -> tuple[_Sender, _Receiver]:
    # Unbounded, so the peer's writes never wait, as a connector's small writes to a pipe do not.
    send, receive = anyio.create_memory_object_stream[bytes](math.inf)
    return _Sender(send), _Receiver(receive, fault)


class _Lines:
    """The peer's transport (mcpl_server.py `Transport`): the host's lines in, its own lines out."""

    def __init__(self, incoming: _Receiver, outgoing: _Sender) -> None:
        self._incoming = incoming
        self._outgoing = outgoing

    async def lines(self) -> AsyncIterator[bytes]:
        pending = bytearray()
        while True:
            try:
                pending += await self._incoming.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                break
            while (end := pending.find(b"\n")) >= 0:
                yield bytes(pending[:end + 1])
                del pending[:end + 1]
        if pending:
            yield bytes(pending)

    def write(self, line: bytes) -> None:
        self._outgoing.write(line)


class _Record:
    """The script's JSON-lines record (as the child's Recorder writes it), closed when the peer ends."""

    def __init__(self, path: str | None) -> None:
        self._handle = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 (closed by `close`)

    def __call__(self, kind: str, **fields: Any) -> None:
        if self._handle is not None:
            self._handle.write(json.dumps({"kind": kind, **fields}) + "\n")
            self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


class _PeerLife:
    """What the script does to its "process" (scripted_connector.py `Life`)."""

    def __init__(self, process: MemoryProcess) -> None:
        self.pid = process.pid
        self._process = process

    def exit(self, code: int) -> None:
        self._process.end(code)

    def stderr(self, text: str) -> None:
        self._process.peer_stderr.write(text.encode("utf-8", "surrogatepass"))


class MemoryProcess(Process):
    """A scripted connector's life in this process, seen by the host as a `Process` with three pipes."""

    def __init__(self, name: str, fault: Fault | None = None) -> None:
        self._pid = next(_pids)
        self._stdin, self.peer_stdin = _pipe()
        self.peer_stdout, self._stdout = _pipe(None if fault is None else (lambda chunk: fault(name, chunk)))
        self.peer_stderr, self._stderr = _pipe()
        self._returncode: int | None = None
        self._exited = anyio.Event()
        self._scope = anyio.CancelScope()
        self.ignore_sigterm = False

    def end(self, code: int) -> None:
        """The life ends now with `code`: its pipes close (what it wrote stays readable) and it stops running."""
        if self._returncode is None:
            self._returncode = code
            for end in (self.peer_stdin, self.peer_stdout, self.peer_stderr):
                end.close()
            self._exited.set()
        self._scope.cancel()

    async def run(self, script: dict[str, Any], environ: dict[str, str]) -> None:
        """Play `script` until it ends, exits or is ended (in the launcher's task group)."""
        record = _Record(script.get("record"))
        self.ignore_sigterm = bool(script.get("ignore_sigterm"))
        code = 0
        try:
            with self._scope:
                try:
                    server, body = scripted_server(script, record, _PeerLife(self),
                                                   transport=_Lines(self.peer_stdin, self.peer_stdout),
                                                   environ=environ)
                    await server.serve(body)
                    if script.get("ignore_eof"):
                        record("eof_ignored")
                        await anyio.sleep_forever()
                except Exception:  # the connector's own failure, as a child's traceback and exit code 1
                    self.peer_stderr.write(traceback.format_exc().encode())
                    code = 1
        finally:
            record.close()
            self.end(code if self._returncode is None else self._returncode)

    # --- anyio's Process ---------------------------------------------------------

    async def wait(self) -> int:
        await self._exited.wait()
        assert self._returncode is not None
        return self._returncode

    def terminate(self) -> None:
        if not self.ignore_sigterm:
            self.end(-signal.SIGTERM)

    def kill(self) -> None:
        self.end(-signal.SIGKILL)

    def send_signal(self, sig: signal.Signals) -> None:
        if sig == signal.SIGKILL:
            self.kill()
        elif sig == signal.SIGTERM:
            self.terminate()

    async def aclose(self) -> None:
        for end in (self._stdin, self._stdout, self._stderr):
            end.close()

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @property
    def stdin(self) -> ByteSendStream:
        return self._stdin

    @property
    def stdout(self) -> ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> ByteReceiveStream:
        return self._stderr


def runs_scripted(spec: ConnectorConfig) -> bool:
    """Whether `spec`'s command runs tests/scripted_connector.py (harness.scripted's and cli/support.py's)."""
    return list(spec.command[-2:]) == ["-m", MODULE]


class MemoryLauncher:
    """Scripted connectors in this process (`MemoryProcess`), every other command as a real child."""

    def __init__(self, tg: TaskGroup, fault: Fault | None = None) -> None:
        self._tg = tg
        self._fault = fault
        #: Each memory process started, in order (a test may end one: `end(code)`, or look at its pid).
        self.started: list[tuple[str, MemoryProcess]] = []

    async def spawn(self, spec: ConnectorConfig) -> Process:
        if not runs_scripted(spec):
            return await CHILD_PROCESSES.spawn(spec)
        environ = child_environment(spec)  # raises EnvFileError as a spawn does
        process = MemoryProcess(spec.name, self._fault)
        self.started.append((spec.name, process))
        self._tg.start_soon(process.run, load_script(environ), environ)
        return process

    async def stop(self, process: Process, spec: ConnectorConfig, log: Any) -> str:
        """The shutdown ladder's steps, each bounded by the connector's own graces: EOF, terminate, kill."""
        if not isinstance(process, MemoryProcess):
            return await CHILD_PROCESSES.stop(process, spec, log)
        with anyio.CancelScope(shield=True):
            await process.stdin.aclose()
            how = "exited"
            with anyio.move_on_after(spec.stop_grace_s):
                await process.wait()
            if process.returncode is None:
                how = "terminated"
                process.terminate()
                with anyio.move_on_after(spec.term_grace_s):
                    await process.wait()
            if process.returncode is None:
                how = "killed"
                process.kill()
            await process.aclose()
        return how


def kill(host: Host, name: str) -> None:
    """SIGKILL, in memory: end connector `name`'s current life at once, as `kill -9` of its process would."""
    launcher = host.launcher
    assert isinstance(launcher, MemoryLauncher), "a memory_host's launcher"
    process = next(process for started, process in reversed(launcher.started) if started == name)
    process.kill()


@asynccontextmanager
async def memory_launcher(fault: Fault | None = None) -> AsyncIterator[MemoryLauncher]:
    """A `MemoryLauncher` whose peers run in a task group of their own, cancelled when the block ends."""
    async with anyio.create_task_group() as tg:
        yield MemoryLauncher(tg, fault)
        tg.cancel_scope.cancel()


@asynccontextmanager
async def memory_host(config: Config, *, fault: Fault | None = None, **options: Any) -> AsyncIterator[Host]:
    """harness.running_host with scripted connectors in memory (`options`: running_host's)."""
    async with memory_launcher(fault) as launcher, running_host(config, launcher=launcher, **options) as host:
        yield host


@asynccontextmanager
async def memory_connected(spec: ConnectorConfig, folder: Path, **options: Any) -> AsyncIterator[Any]:
    """harness.connected with the scripted connector in memory: one McplConnection, no supervisor, no process."""
    async with memory_launcher() as launcher, connected(spec, folder, launcher=launcher, **options) as connection:
        yield connection
