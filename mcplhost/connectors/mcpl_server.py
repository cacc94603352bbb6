"""The server side of MCPL over stdio, for small connectors (standard library only).

    server = McplServer("demo", manifest={"version": "0.5", "pushEvents": True, ...})

    async def main(server):
        await server.ready.wait()                      # the host's policy arrived
        await server.request("channels/register", {"channels": [...]})

    server.run(main)

`run` answers `initialize` with the manifest under
``capabilities.experimental.mcpl``, records the grant from
``featureSets/update`` (answering with an accepted receipt unless told
otherwise), answers ``ping``, and runs `main` beside the read loop. Every
message goes out as one compact JSON line; logs go to stderr.

MCP tools (with ``tools=True``): `add_tool(name, handler, ...)` registers
one; ``tools/list`` and ``tools/call`` are answered from what is
registered, and `tools_changed()` sends ``notifications/tools/list_changed``.

The lines come from stdin and go to stdout (`Stdio`); a server given another
`transport` (anything with `lines()` and `write(line)`) speaks over that
instead, and `await serve(main)` runs it in a loop that is already running.

A stub's timed scenario (a message every N seconds) runs its steps through
`timed_steps()`: on wall time each step waits its seconds. Test-only: with
``MCPL_TEST_CLOCK`` naming a Unix socket, each wait is that clock's instead
(the steps keep their order and their content, only the waiting goes); a
deployment never sets it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeAlias

#: A JSON-RPC message, params or result as this connector sends it (the connectors import nothing of the host,
#: so this is theirs; the host's own is mcplhost/jsonobject.py).
JsonObject: TypeAlias = dict[str, Any]

Handler = Callable[[dict[str, Any]], Awaitable[Any]]
#: An MCP tool: its arguments in, its content blocks out (raise to answer with isError).
ToolHandler = Callable[[dict[str, Any]], Awaitable[list[dict[str, Any]]]]


class RemoteError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.error = error


def log(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


class McplServer:
    def __init__(
        self,
        name: str,
        manifest: dict[str, Any] | None,
        *,
        version: str = "0.1.0",
        tools: bool = False,
        transport: Transport | None = None,
    ) -> None:
        self.name = name
        self.transport = transport if transport is not None else Stdio()
        self.manifest = manifest
        self.version = version
        self.tools = tools
        self.grant: list[str] = []
        self.policy: dict[str, Any] | None = None
        self.initialized = asyncio.Event()
        self.ready = asyncio.Event()
        self.closed = asyncio.Event()
        self.handlers: dict[str, Handler] = {}
        self.notification_handlers: dict[str, Handler] = {}
        self.receipt: Callable[[dict[str, Any]], Awaitable[Any]] = self._accept_policy
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.on_message: Callable[[dict[str, Any]], None] = lambda message: None
        self.on_send: Callable[[dict[str, Any]], None] = lambda message: None
        self.mcp_tools: dict[str, tuple[dict[str, Any], ToolHandler]] = {}

    # --- MCP tools -------------------------------------------------------------

    def add_tool(self, name: str, handler: ToolHandler, *, description: str = "",
                 input_schema: dict[str, Any] | None = None) -> None:
        self.mcp_tools[name] = ({"name": name, "description": description,
                                 "inputSchema": input_schema or {"type": "object", "properties": {}}}, handler)

    def tools_changed(self) -> None:
        self.notify("notifications/tools/list_changed")

    async def _call_tool(self, params: dict[str, Any]) -> JsonObject:
        entry = self.mcp_tools.get(params.get("name", ""))
        if entry is None:
            return {"content": text(f"unknown tool {params.get('name')!r}"), "isError": True}
        try:
            return {"content": await entry[1](params.get("arguments") or {})}
        except Exception as exc:  # the tool's failure is its result, as MCP has it
            return {"content": text(f"{type(exc).__name__}: {exc}"), "isError": True}

    # --- sending ---------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        self.on_send(message)
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        self.transport.write(line.encode("utf-8", "surrogatepass") + b"\n")

    async def request(self, method: str, params: Any = None, *, timeout: float = 30.0) -> Any:
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(request_id, None)

    async def request_encoded(self, method: str, params_json: str, *, timeout: float = 30.0) -> Any:
        """`request` with the params already encoded as JSON (for load generators)."""
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        line = f'{{"jsonrpc":"2.0","id":{request_id},"method":{json.dumps(method)},"params":{params_json}}}\n'
        self.transport.write(line.encode("utf-8"))
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(request_id, None)

    def notify(self, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    # --- receiving -------------------------------------------------------------

    async def _accept_policy(self, params: dict[str, Any]) -> Any:
        return {"accepted": True}

    async def _on_request(self, message: dict[str, Any]) -> None:
        method, params, request_id = message["method"], message.get("params") or {}, message["id"]
        try:
            if method in self.handlers:  # a connector may override any built-in answer
                result: Any = await self.handlers[method](params)
            elif method == "initialize":
                capabilities: dict[str, Any] = {}
                if self.tools:
                    capabilities["tools"] = {}
                if self.manifest is not None:
                    capabilities["experimental"] = {"mcpl": self.manifest}
                result = {
                    "protocolVersion": params.get("protocolVersion", "2024-11-05"),
                    "capabilities": capabilities,
                    "serverInfo": {"name": self.name, "version": self.version},
                }
            elif method == "featureSets/update":
                self.policy = params
                result = await self.receipt(params)
                if result is not NO_ANSWER:
                    self.grant = list(params.get("effectiveCapabilities") or [])
                    self.ready.set()
            elif method == "ping":
                result = {}
            elif method == "tools/list" and self.tools:
                result = {"tools": [spec for spec, _ in self.mcp_tools.values()]}
            elif method == "tools/call" and self.tools:
                result = await self._call_tool(params)
            else:
                self.send({"jsonrpc": "2.0", "id": request_id,
                           "error": {"code": -32601, "message": f"Method not found: {method}"}})
                return
        except RemoteError as exc:  # a handler chose to answer with an error
            self.send({"jsonrpc": "2.0", "id": request_id, "error": exc.error})
            if method == "featureSets/update":
                self.ready.set()  # answered all the same (a 0.4 server's -32601): the policy arrived
            return
        if result is not NO_ANSWER:
            self.send({"jsonrpc": "2.0", "id": request_id, "result": result})

    async def _dispatch(self, message: dict[str, Any]) -> None:
        if "method" in message and "id" in message:
            # Each request in its own task, so a slow handler never blocks the reader.
            task = asyncio.create_task(self._on_request(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif "method" in message:
            if message["method"] == "notifications/initialized":
                self.initialized.set()
            handler = self.notification_handlers.get(message["method"])
            if handler is not None:
                await handler(message.get("params") or {})
        elif message.get("id") in self._pending:
            future = self._pending[message["id"]]
            if not future.done():
                if "error" in message:
                    future.set_exception(RemoteError(message["error"]))
                else:
                    future.set_result(message.get("result"))

    async def _read_loop(self) -> None:
        async for line in self.transport.lines():
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                log(f"{self.name}: skipping a non-JSON line")
                continue
            self.on_message(message)
            await self._dispatch(message)
        self.closed.set()

    def run(self, main: Callable[[McplServer], Awaitable[Any]] | None = None) -> None:
        """Serve until stdin ends (the host's request to stop), running `main` beside."""
        try:
            asyncio.run(self.serve(main))
        except KeyboardInterrupt:
            pass

    async def serve(self, main: Callable[[McplServer], Awaitable[Any]] | None = None) -> None:
        """Serve until the transport's lines end, running `main` beside; cancelled, it cancels what it started."""

        async def guarded(main: Callable[[McplServer], Awaitable[Any]]) -> None:
            try:
                await main(self)
            except Exception:  # the connector's own failure: say so at once, with its traceback
                log(f"{self.name}: main failed:\n{traceback.format_exc()}")

        reader = asyncio.create_task(self._read_loop())
        worker = asyncio.create_task(guarded(main)) if main is not None else None
        try:
            await reader
            if worker is not None:
                worker.cancel()
                try:
                    await worker
                except asyncio.CancelledError:
                    pass
        finally:
            # What asyncio.run cancels at its end, cancelled here, for a loop that goes on after this server.
            for task in (reader, worker, *self._tasks):
                if task is not None:
                    task.cancel()


#: A handler returns this to leave a request unanswered (for tests of host timeouts).
NO_ANSWER = object()


class Transport(Protocol):
    """Where a server's lines come from and go to."""

    def lines(self) -> AsyncIterator[bytes]:
        """Each line the host sent, newline included, until the host closes its end."""
        ...

    def write(self, line: bytes) -> None:
        """Send one whole line (newline included) at once."""
        ...


class Stdio:
    """The lines of stdin and stdout: how a connector the host spawned speaks."""

    async def lines(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            yield line

    def write(self, line: bytes) -> None:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()


def text(body: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": body}]


class Recorder:
    """Appends what a test connector did, one JSON object per line, to `path` (nothing when it is None)."""

    def __init__(self, path: str | None) -> None:
        self._handle = open(path, "a", encoding="utf-8") if path else None

    def __call__(self, kind: str, **fields: Any) -> None:
        if self._handle is not None:
            self._handle.write(json.dumps({"kind": kind, **fields}) + "\n")
            self._handle.flush()


# --- timed steps ---------------------------------------------------------------------

#: Test-only: the path of a Unix socket serving a stepped clock. Set, each timed step asks that clock for its
#: turn instead of sleeping; the clock does not move while a step runs.
TEST_CLOCK_ENV = "MCPL_TEST_CLOCK"


class WallSteps:
    """Timed steps on wall time: each `after(seconds)` sleeps that long."""

    async def after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ClockSteps:
    """Timed steps on a test clock, over one connection for the whole scenario.

    Protocol, one line each way: the scenario sends the seconds its next step
    waits (which also says its previous step has ended); the clock answers
    `go` when its time reaches that step's. Closing the connection says the
    scenario is over. A clock that went away (the test is over) never answers:
    the scenario waits until the connector is stopped.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def after(self, seconds: float) -> None:
        self._writer.write(f"{seconds!r}\n".encode())
        await self._writer.drain()
        if not await self._reader.readline():
            await asyncio.Event().wait()

    def close(self) -> None:
        self._writer.close()


@asynccontextmanager
async def timed_steps() -> AsyncIterator[WallSteps | ClockSteps]:
    """The steps of one timed scenario: `await steps.after(seconds)` before each (see TEST_CLOCK_ENV)."""
    path = os.environ.get(TEST_CLOCK_ENV)
    if not path:
        yield WallSteps()
        return
    steps = ClockSteps(*await asyncio.open_unix_connection(path))
    try:
        yield steps
    finally:
        steps.close()
