"""Shared helpers for end-to-end tests: real connector subprocesses, a real SQLite file.

    spec = scripted("disc", {"manifest": {...}, "steps": [...]}, tmp_path, grant=[...])
    async with running_host(config_with(tmp_path, spec)) as host:
        await wait_for(lambda: record(tmp_path, "disc").done)
    rows = await stored_items(tmp_path)
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from mcplhost.config import Config, ConnectorConfig, RestartConfig, StoreConfig
from mcplhost.host import Host
from mcplhost.store import StoredItem, open_reader

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent

#: A 0.5 manifest with everything a chat connector uses.
CHAT_MANIFEST: dict[str, Any] = {
    "version": "0.5",
    "pushEvents": True,
    "channels": {"register": True, "incoming": True, "publish": True, "lifecycle": True},
    "featureSets": {
        "chat": {"description": "chat", "uses": ["channels.register", "channels.incoming", "pushEvents"]},
    },
}
CHAT_GRANT = ["channels.register", "channels.incoming", "pushEvents", "channels.lifecycle"]


def scripted(name: str, script: dict[str, Any], folder: Path, **fields: Any) -> ConnectorConfig:
    """A connector running connectors.scripted with `script`, recording to folder/<name>.jsonl."""
    script = {**script, "record": str(folder / f"{name}.jsonl")}
    fields.setdefault("restart", RestartConfig(policy="never"))
    fields.setdefault("request_timeout_s", 5.0)
    return ConnectorConfig(
        name=name,
        command=[PYTHON, "-m", "connectors.scripted"],
        env={"MCPL_SCRIPT": json.dumps(script), "PYTHONPATH": str(REPO)},
        cwd=str(REPO),
        **fields,
    )


def config_with(folder: Path, *connectors: ConnectorConfig, synchronous: str = "NORMAL") -> Config:
    return Config(store=StoreConfig(path=str(folder / "host.db"), synchronous=synchronous),  # type: ignore[arg-type]
                  connectors=list(connectors))


class Record:
    """What a scripted connector saw and did, read from its JSON-lines record."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    @property
    def received(self) -> list[dict[str, Any]]:
        return [e["message"] for e in self.events if e["kind"] == "in"]

    @property
    def sent(self) -> list[dict[str, Any]]:
        return [e["message"] for e in self.events if e["kind"] == "out"]

    @property
    def done(self) -> bool:
        return any(e["kind"] == "done" for e in self.events)

    def answers(self) -> dict[int, dict[str, Any]]:
        """Step index → the host's answer (result or error) to that step's request."""
        return {e["step"]: e for e in self.events if e["kind"] == "answer" and "item" not in e}

    def answer(self, step: int) -> dict[str, Any]:
        return self.answers()[step]

    def methods_received(self) -> list[str]:
        return [m["method"] for m in self.received if "method" in m]


def record(folder: Path, name: str) -> Record:
    path = folder / f"{name}.jsonl"
    if not path.exists():
        return Record([])
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass  # a line still being written
    return Record(events)


async def wait_for(condition: Callable[[], Any], timeout: float = 15.0, interval: float = 0.02) -> Any:
    """Await a condition over files or processes (there is no event to wait on), bounded."""
    with anyio.fail_after(timeout):
        while True:
            value = condition()
            if value:
                return value
            await anyio.sleep(interval)


@asynccontextmanager
async def running_host(config: Config, *, wait_ready: bool = True) -> AsyncIterator[Host]:
    """Run a Host in this test's event loop; stop it gracefully on exit."""
    host = Host(config)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(host.run, stop)
        if wait_ready:
            with anyio.fail_after(30):
                await host.ready.wait()
        try:
            yield host
        finally:
            stop.set()


async def stored_items(folder: Path, **filters: Any) -> list[StoredItem]:
    async with open_reader(folder / "host.db") as store:
        return await store.items.list(**filters)


def texts(item: StoredItem) -> list[str]:
    return [block.get("text", "") for block in item.content]
