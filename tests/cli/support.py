"""Helpers for the CLI tests: `mcplhost` called in-process or as a real subprocess, TOML configs, a notify socket.

    result = cli("check-config", str(path))          # cli.main in this process: stdout, stderr, exit code
    path = write_config(tmp_path, [scripted_connector("disc", script, tmp_path)])
    async with daemon(path, tmp_path) as run:        # `mcplhost run` as a process of its own (forked)
        await run.wait_event("host.ready")
        run.signal(signal.SIGTERM)
        assert await run.wait() == 0

Most CLI tests check parsing, usage errors, exit codes, messages and what an
offline command prints: `cli()` calls `mcplhost.cli.main(argv)` in this
process (no interpreter start, no imports), with stdin at /dev/null and
stdout and stderr captured. A process of its own (`cli_process()`; `daemon()`,
forked from the test process's fork server with the package loaded,
tests/forkserver.py; the pty and pipe runs in test_dev.py) is kept only where
the process itself is what is tested:

- signals and the graceful stop (test_run.py `TestSignals`, SIGINT in test_dev.py), SIGHUP;
- systemd notify and the watchdog (test_systemd.py): the daemon's own pid and NOTIFY_SOCKET;
- `run` and `dev` end to end (test_run.py, test_dev.py's terminal and stdin runs): `run` marks its process
  non-dumpable and installs signal handlers, neither of which a test runner should take on;
- a stdout whose reader went away (`| head`, test_messages.py, test_turns.py): the exit on a closed pipe
  points the process's own stdout at /dev/null;
- a database lock held by another process (test_lock.py): the holder is a real daemon;
- `mcplhost connector NAME`, which replaces the process (exec).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import Process

from mcplhost import cli as mcplhost_cli
from mcplhost import logs
from mcplhost.dev import bundled_connectors

from ..forkserver import ForkedProcess, forked
from ..harness import PYTHON, REPO, SCRIPTED_COMMAND, wait_for

#: Variables of the test run's own environment that would change what `mcplhost` does.
SCRUBBED = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "MCPLHOST_CONFIG", "MCPLHOST_LOG_FLUSH_S", "MCPL_TEST_CLOCK",
            "MCPLHOST_STATE_DIR", "PGPASSWORD", "PGPASSFILE")
#: How long an in-process call run beside a running event loop may take before the test fails.
IN_PROCESS_TIMEOUT_S = 60.0


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra or {})
    return env


def cli_process(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `python -m mcplhost ARGS` to its end; stdout and stderr captured as text."""
    return subprocess.run([PYTHON, "-m", "mcplhost", *args], cwd=cwd or REPO, env=cli_env(env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


class Captured(io.TextIOWrapper):
    """A stdout or stderr that keeps what is written (text, or bytes through `.buffer`) and has no descriptor.

    `on_write` is called after each text write (the stepped clock watches dev's live view through it).
    """

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
        self.on_write: Callable[[], None] = lambda: None

    def write(self, text: str) -> int:
        written = super().write(text)
        self.on_write()
        return written

    def text(self) -> str:
        self.flush()
        return self.peek()

    def peek(self) -> str:
        """What was written so far, from any thread (text writes go straight through to the bytes)."""
        raw = self.buffer
        assert isinstance(raw, io.BytesIO)
        return raw.getvalue().decode("utf-8", "replace")


@contextmanager
def in_process(cwd: Path | None = None, env: Mapping[str, str] | None = None,
               stdout: Captured | None = None) -> Iterator[tuple[Captured, Captured]]:
    """This process as `mcplhost` would find it: the scrubbed environment plus `env`, `cwd`, stdin at
    /dev/null, stdout (into `stdout` when given) and stderr captured; everything (logging included) put back
    afterwards."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    saved_logging = structlog.get_config()
    for name in SCRUBBED:
        os.environ.pop(name, None)
    os.environ.update(env or {})
    os.chdir(cwd or REPO)
    out, err = stdout or Captured(), Captured()
    with open(os.devnull, encoding="utf-8") as stdin:
        sys.stdin, sys.stdout, sys.stderr = stdin, out, err
        try:
            yield out, err
        finally:
            logs.shutdown()  # main shuts logging down itself; this covers a call that raised
            sys.stdin, sys.stdout, sys.stderr = saved_streams
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
            structlog.configure(**saved_logging)


def exit_code(call: Callable[[], int]) -> int:
    """What `call` returns, or the code of the SystemExit it raises (argparse: usage errors, --help, --version)."""
    try:
        return call()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1


def cli(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
        stdout: Captured | None = None) -> subprocess.CompletedProcess[str]:
    """`mcplhost ARGS` called in-process (`mcplhost.cli.main`) to its end, like `cli_process`.

    From inside a running event loop (an async test that prepared a database)
    the call runs in a thread of its own, since `main` starts its own loop;
    the test waits for it as it would for a subprocess.
    """
    assert not (args[:1] == ("connector",) and set(args[1:2]) & set(bundled_connectors())), (
        "`connector NAME` replaces the process: use cli_process")
    argv = list(args)
    with in_process(cwd, env, stdout) as (out, err):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            code = exit_code(lambda: mcplhost_cli.main(argv))
        else:
            codes: list[int] = []
            worker = threading.Thread(target=lambda: codes.append(exit_code(lambda: mcplhost_cli.main(argv))),
                                      name="mcplhost-cli-in-process")
            worker.start()
            worker.join(IN_PROCESS_TIMEOUT_S)
            assert not worker.is_alive() and codes, f"mcplhost {' '.join(args)} did not end"
            code = codes[0]
        return subprocess.CompletedProcess(["mcplhost", *argv], code, out.text(), err.text())


# --- configuration files -----------------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


def toml_table(header: str, table: Mapping[str, Any]) -> str:
    """A table under `header`; nested tables (restart, env) are written inline."""
    return "\n".join([header, *(f"{key} = {toml_value(value)}" for key, value in table.items())]) + "\n"


def write_config(folder: Path, connectors: list[dict[str, Any]] | None = None, *, store: str = "host.db",
                 name: str = "mcplhost.toml") -> Path:
    """A config file in `folder` with a store and these [[connectors]] tables."""
    text = toml_table("[store]", {"path": store})
    for connector in connectors or []:
        text += "\n" + toml_table("[[connectors]]", connector)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def scripted_connector(name: str, script: dict[str, Any], folder: Path, **fields: Any) -> dict[str, Any]:
    """A [[connectors]] table running tests/scripted_connector.py, recording to folder/<name>.jsonl."""
    script_path = folder / f"{name}.script.json"  # a file: a long script would not fit in one env variable
    script_path.write_text(json.dumps({**script, "record": str(folder / f"{name}.jsonl")}), encoding="utf-8")
    return {"name": name, "command": SCRIPTED_COMMAND,
            "env": {"MCPL_SCRIPT": f"@{script_path}", "PYTHONPATH": str(REPO)}, "cwd": str(REPO),
            "request_timeout_s": 5, "stop_grace_s": 1, "term_grace_s": 1,
            **fields}


# --- the daemon --------------------------------------------------------------------


class Daemon:
    """A running `mcplhost run`; its stderr (JSON log lines) goes to a file the test reads."""

    def __init__(self, process: Process | ForkedProcess, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def lines(self) -> list[dict[str, Any]]:
        """Every complete log line, parsed; a line that is not JSON fails the test."""
        text = self.stderr()
        complete = text[: text.rfind("\n") + 1]
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def events(self, name: str, **fields: Any) -> list[dict[str, Any]]:
        return [e for e in self.lines() if e.get("event") == name and all(e.get(k) == v for k, v in fields.items())]

    async def wait_event(self, name: str, timeout: float = 20, **fields: Any) -> dict[str, Any]:
        """The first log line called `name` with these fields, awaited (bounded)."""
        found = await wait_for(lambda: self.events(name, **fields), timeout=timeout)
        return found[0]

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    async def wait(self, timeout: float = 30) -> int:
        """The daemon's exit code, awaited (bounded)."""
        with anyio.fail_after(timeout):
            return await self.process.wait()


@asynccontextmanager
async def daemon(config: Path | None, folder: Path, *, env: Mapping[str, str] | None = None,
                 args: tuple[str, ...] = (), cwd: Path | None = None,
                 command: list[str] | None = None, umask: int = -1) -> AsyncIterator[Daemon]:
    """Start `mcplhost run [--config CONFIG] ARGS` (under `umask`, -1: this process's); killed at the end if the
    test left it running. Forked from the test process's fork server (tests/forkserver.py), or with `command`
    spawned as that command."""
    log_path = folder / f"run-{uuid.uuid4().hex[:8]}.log"
    process: Process | ForkedProcess
    if command is None:
        process = forked(["run", *(["--config", str(config)] if config else []), *args], env=cli_env(env),
                               cwd=cwd or REPO, stderr=log_path, umask=umask)
    else:
        with open(log_path, "wb") as log:
            process = await anyio.open_process(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                               stderr=log, env=cli_env(env), cwd=cwd or REPO, umask=umask)
    try:
        yield Daemon(process, log_path)
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.wait()
            await process.aclose()



# --- systemd's notify socket -----------------------------------------------------------


class NotifySocket:
    """A Unix datagram socket standing in for systemd: collects what the daemon sends, with arrival times."""

    def __init__(self, address: str) -> None:
        self.address = address  # as NOTIFY_SOCKET spells it ("@name" is the abstract namespace)
        self.received: list[tuple[float, str]] = []
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind("\0" + address[1:] if address.startswith("@") else address)
        self._socket.setblocking(False)

    @classmethod
    def abstract(cls) -> NotifySocket:
        return cls(f"@mcplhost-test-{uuid.uuid4().hex}")

    def poll(self) -> list[str]:
        """Everything received so far (reading what arrived since the last call)."""
        while True:
            try:
                data = self._socket.recv(4096)
            except BlockingIOError:
                break
            self.received.append((time.monotonic(), data.decode()))
        return [message for _, message in self.received]

    def when(self, message: str) -> float:
        """When `message` first arrived (time.monotonic())."""
        return next(t for t, m in self.received if m == message)

    async def wait(self, message: str, timeout: float = 20) -> float:
        await wait_for(lambda: message in self.poll(), timeout=timeout, interval=0.005)
        return self.when(message)

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> NotifySocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

