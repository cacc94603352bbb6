"""Helpers for the CLI tests: `mcplhost` as a real subprocess, TOML configs in tmp_path, a notify socket.

    path = write_config(tmp_path, [scripted_connector("disc", script, tmp_path)])
    async with daemon(path, tmp_path) as run:
        await run.wait_event("host.ready")
        run.signal(signal.SIGTERM)
        assert await run.wait() == 0
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process

from ..harness import PYTHON, REPO, wait_for

#: Variables of the test run's own environment that would change what `mcplhost` does.
SCRUBBED = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "MCPLHOST_CONFIG")


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra or {})
    return env


def cli(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `python -m mcplhost ARGS` to its end; stdout and stderr captured as text."""
    return subprocess.run([PYTHON, "-m", "mcplhost", *args], cwd=cwd or REPO, env=cli_env(env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


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
    """A [[connectors]] table running connectors.scripted, recording to folder/<name>.jsonl."""
    script_path = folder / f"{name}.script.json"  # a file: a long script would not fit in one env variable
    script_path.write_text(json.dumps({**script, "record": str(folder / f"{name}.jsonl")}), encoding="utf-8")
    return {"name": name, "command": [PYTHON, "-m", "mcplhost.connectors.scripted"],
            "env": {"MCPL_SCRIPT": f"@{script_path}", "PYTHONPATH": str(REPO)}, "cwd": str(REPO),
            "request_timeout_s": 5, "stop_grace_s": 1, "term_grace_s": 1,
            **fields}


# --- the daemon --------------------------------------------------------------------


class Daemon:
    """A running `mcplhost run`; its stderr (JSON log lines) goes to a file the test reads."""

    def __init__(self, process: Process, log_path: Path) -> None:
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
                 command: list[str] | None = None) -> AsyncIterator[Daemon]:
    """Start `mcplhost run [--config CONFIG] ARGS`; killed at the end if the test left it running."""
    log_path = folder / f"run-{uuid.uuid4().hex[:8]}.log"
    argv = command or [PYTHON, "-m", "mcplhost", "run", *(["--config", str(config)] if config else []), *args]
    with open(log_path, "wb") as log:
        process = await anyio.open_process(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                           env=cli_env(env), cwd=cwd or REPO)
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

