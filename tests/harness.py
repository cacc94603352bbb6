"""Shared helpers for end-to-end tests: real connector subprocesses, a real SQLite file.

    spec = scripted("disc", {"manifest": {...}, "steps": [...]}, tmp_path, grant=[...])
    async with running_host(config_with(tmp_path, spec)) as host:
        await wait_for(lambda: record(tmp_path, "disc").done)
    rows = await stored_items(tmp_path)
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, ObjectSendStream

from mcplhost.config import Config, ConnectorConfig, RestartConfig, StoreConfig
from mcplhost.host import Host, open_host
from mcplhost.ingest import Stored
from mcplhost.rpc import Session, SessionLimits
from mcplhost.store import StoredItem, open_reader
from mcplhost.supervisor.process import CHILD_PROCESSES, Launcher

from .scripted_connector import MODULE

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent
#: The tests' scripted connector as a child (tests/scripted_connector.py; run from REPO, or with it on PYTHONPATH).
SCRIPTED_COMMAND = [PYTHON, "-m", MODULE]

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
    """A connector running tests/scripted_connector.py with `script`, recording to folder/<name>.jsonl."""
    script = {**script, "record": str(folder / f"{name}.jsonl")}
    fields.setdefault("restart", RestartConfig(policy="never"))
    fields.setdefault("request_timeout_s", 5.0)
    return ConnectorConfig(
        name=name,
        command=SCRIPTED_COMMAND,
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


async def http_exchange(address: str, request: bytes, timeout: float = 5.0) -> bytes:
    """Send `request` to HOST:PORT and read the whole answer (the server closes after it), bounded."""
    host, port = address.rsplit(":", 1)
    with anyio.fail_after(timeout):
        async with await anyio.connect_tcp(host, int(port)) as stream:
            await stream.send(request)
            chunks = []
            try:
                while True:
                    chunks.append(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    return b"".join(chunks)


async def wait_for(condition: Callable[[], Any], timeout: float = 15.0, interval: float = 0.02) -> Any:
    """Await a condition over files or processes (there is no event to wait on), bounded."""
    with anyio.fail_after(timeout):
        while True:
            value = condition()
            if value:
                return value
            await anyio.sleep(interval)


@asynccontextmanager
async def running_host(config: Config, *, wait_ready: bool = True, events: ObjectSendStream[Stored] | None = None,
                       launcher: Launcher = CHILD_PROCESSES) -> AsyncIterator[Host]:
    """Run a Host in this test's event loop; stop it gracefully on exit (`events`, `launcher`: see mcplhost/host.py).

    tests/memory_pair.py `memory_host` runs it with the scripted connectors in memory.
    """
    stop = anyio.Event()
    async with open_host(config, events=events, launcher=launcher) as host, anyio.create_task_group() as tg:
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


def count_rows(db: Path, table: str, where: str = "1") -> int:
    """Rows of `table` matching the SQL condition `where`, read with plain sqlite3 beside a running daemon.

    For a wait_for over a daemon's database: a poll that spawns no process (0 before the schema exists).
    """
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()[0]
    except sqlite3.OperationalError:
        return 0  # the schema is still being made
    finally:
        conn.close()


# --- helpers for the protocol suite (tests/protocol/*_wire.py) -------------------


async def items_when(folder: Path, count: int, timeout: float = 15.0, **filters: Any) -> list[StoredItem]:
    """Await at least `count` stored items (read beside the running host); return them all."""
    with anyio.fail_after(timeout):
        while True:
            if (folder / "host.db").exists():
                try:
                    items = await stored_items(folder, **filters)
                except Exception:  # the schema may still be migrating: look again
                    items = []
                if len(items) >= count:
                    return items
            await anyio.sleep(0.02)


def received(folder: Path, name: str, method: str) -> list[dict[str, Any]]:
    """Every `method` message scripted connector `name` received, in order (e.g. its channels/publish requests)."""
    return [m for m in record(folder, name).received if m.get("method") == method]


def logged(logs: list[dict[str, Any]], event: str, **fields: Any) -> list[dict[str, Any]]:
    """The captured log entries named `event` whose fields include `fields`."""
    return [e for e in logs if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())]


def error_of(rec: Record, step: int) -> dict[str, Any]:
    """The JSON-RPC error object the host answered a step's request with (fails if it was a result)."""
    answer = rec.answer(step)
    assert "error" in answer and "result" not in answer, answer
    return answer["error"]


def result_of(rec: Record, step: int) -> Any:
    """The result the host answered a step's request with (fails if it was an error)."""
    answer = rec.answer(step)
    assert "result" in answer, answer
    return answer["result"]


@asynccontextmanager
async def connected(spec: ConnectorConfig, folder: Path, *, intake: Any = None, handshake: bool = True,
                    launcher: Launcher = CHILD_PROCESSES) -> AsyncIterator[Any]:
    """One McplConnection on a connector `launcher` starts (a real subprocess) and a real store, no supervisor.

    For tests that drive the connection from the host side (`send_policy`,
    `refresh_manifest`). Yields the connection after its handshake; on exit
    the child goes through the shutdown ladder. tests/memory_pair.py
    `memory_connected` runs the scripted connector in memory.
    """
    import structlog

    from mcplhost.ingest import Ingest
    from mcplhost.protocol.connection import McplConnection
    from mcplhost.speech.echoes import EchoMemory
    from mcplhost.store import open_store
    from mcplhost.store.writer import GroupWriter
    clog = structlog.get_logger().bind(connector=spec.name)
    async with open_store(folder / "host.db") as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        process = await launcher.spawn(spec)
        session = Session(process.stdin, process.stdout, log=clog,  # type: ignore[arg-type]
                          limits=SessionLimits(max_line_bytes=spec.max_line_bytes, timeout=spec.request_timeout_s))
        if intake is None:
            intake = Ingest(store, writer, clog, echoes=EchoMemory(store.outbox))
        connection = McplConnection(spec, session, intake, clog)
        tg.start_soon(session.run)
        tg.start_soon(connection.run_background)
        try:
            if handshake:
                await connection.handshake()
            yield connection
        finally:
            connection.close_jobs()
            await launcher.stop(process, spec, clog)
            tg.cancel_scope.cancel()


async def change_grant(connection: Any, grant: frozenset[str]) -> None:
    """Change a `connected` connection's grant from the host side, as a re-fetched manifest does (`send_policy`)."""
    await connection.send_policy(frozenset(grant), initial=False)


class _GonePeer(ByteReceiveStream, ByteSendStream):
    """The far end of a session whose peer is already gone: reads end at once, writes go nowhere."""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        raise anyio.EndOfStream

    async def send(self, item: bytes) -> None:
        return None

    async def aclose(self) -> None:
        return None


def gone_session() -> Session:
    """A session for a McplConnection with no process behind it; running it ends at once and closes it.

    Its cancel scopes need an async backend, so outside an event loop it is
    built inside a short one (it is never run there).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(_gone_session)
    return Session(_GonePeer(), _GonePeer())


async def _gone_session() -> Session:
    return Session(_GonePeer(), _GonePeer())


async def nudge(connection: Any, method: str) -> None:
    """Send the connector a host request it does not know, so a script's {"wait": method} step goes on."""
    from mcplhost.rpc import RemoteError

    try:
        await connection.session.request(method, {})
    except RemoteError:
        pass  # -32601 from the connector is the expected answer


#: Like CHAT_MANIFEST, but pushes have a feature set of their own ("alerts"), so
#: granting or revoking a channel capability never disables the set a push names.
SPLIT_MANIFEST: dict[str, Any] = {
    "version": "0.5",
    "pushEvents": True,
    "channels": {"register": True, "incoming": True, "publish": True, "lifecycle": True},
    "featureSets": {
        "chat": {"description": "chat", "uses": ["channels.register", "channels.incoming"]},
        "alerts": {"description": "alerts", "uses": ["pushEvents"]},
    },
}


#: A well-formed mcpl/manifestChanged hint for scripted steps; its revision is a claim the host never relies on.
HINT = {"notify": "mcpl/manifestChanged", "params": {"revision": "sha256:" + "A" * 43, "domains": ["capabilities"]}}


class Beside:
    """`target` with some attributes replaced, every other one its own: how a test puts a fault, or a write from
    beside, into a component's dependency (`sender.handle = Beside(sender.handle, request=failing)`)."""

    def __init__(self, target: Any, **replaced: Any) -> None:
        self._target = target
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
