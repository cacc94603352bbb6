"""The tests' scriptable connector: does what its script says, records what it sees.

    python -m tests.scripted_connector        (cwd or PYTHONPATH: the repository; harness.scripted builds the spec)

It runs as a real child (`harness.scripted`, through `mcplhost run` or the
supervisor), or in the test's own process over memory streams
(tests/memory_pair.py), where the same script plays the same way.

The script is JSON in the environment variable MCPL_SCRIPT (or ``@path`` to a
file). Every message received and sent, and every step's outcome, is appended
to the JSON-lines file named by ``record``. Members, all optional:

    name            serverInfo.name (default "scripted")
    manifest        the capabilities.experimental.mcpl object (null: plain MCP)
    tools           advertise MCP tools (default false)
    initialize      "answer" | "ignore" | "exit"       how to meet `initialize`
    policy          the featureSets/update answer: {"result": ...} | {"error": ...}
                    | "ignore" | {"delay": seconds, "result": ...}   (default accepted),
                    or a list of those: the nth featureSets/update gets the nth,
                    the last one answers every later update
    after           "ready" | "initialized" | "start"  when the steps begin (default "ready")
    steps           a list, run in order:
                      {"request": method, "params": ...}   awaits and records the answer
                      {"requests": [[method, params], ...]} sends all, then awaits all
                      {"notify": method, "params": ...}
                      {"raw": "a line"}                     written to stdout as it is
                      {"sleep": seconds}
                      {"stderr": "text", "repeat": n}
                      {"wait": method}                      until that method arrives
                      {"wait": method, "count": n}          until its nth message arrives
                      {"exit": code}
    handlers        {method: {"result": ...} | {"error": ...} | "ignore"} for host requests
                    (`tools/list`, `tools/call`, `context/beforeInference`, `channels/open`...);
                    {"delay": seconds, ...} answers late; a list: the nth request gets the
                    nth answer, the last one answers every later request
    notifications   a list of notification methods (e.g. "inference/lifecycle") also recorded
                    as {"kind": "notified", "method", "params"} when they arrive
    ignore_sigterm  true: SIGTERM does nothing
    ignore_eof      true: keep running after stdin ends
    exit_after      exit with this code once the steps are done
    record          path of the JSON-lines record; its first event in each process
                    life is {"kind": "start", "pid": ..., "t": time.monotonic()}
    record_env      true: the "start" event also carries the process environment
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from mcplhost.connectors.mcpl_server import NO_ANSWER, McplServer, Recorder, RemoteError, Stdio, Transport

USAGE = __doc__
#: The argv tail that runs this connector (`python -m tests.scripted_connector`).
MODULE = "tests.scripted_connector"


class Life(Protocol):
    """What a script does to the process it runs in: a real child's, or a stand-in's (tests/memory_pair.py)."""

    pid: int

    def exit(self, code: int) -> None:
        """End at once with `code`, as os._exit does: nothing more is written."""
        ...

    def stderr(self, text: str) -> None:
        ...


class ChildLife:
    """The life of a real child process."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def exit(self, code: int) -> None:
        os._exit(code)

    def stderr(self, text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()


def load_script(environ: Mapping[str, str]) -> dict[str, Any]:
    raw = environ.get("MCPL_SCRIPT", "{}")
    if raw.startswith("@"):
        with open(raw[1:], encoding="utf-8") as handle:
            raw = handle.read()
    return json.loads(raw)


def answer(spec: Any) -> Any:
    if spec == "ignore":
        return NO_ANSWER
    if isinstance(spec, dict) and "error" in spec:
        raise RemoteError(spec["error"])
    return spec.get("result", {}) if isinstance(spec, dict) else spec


async def run_steps(server: McplServer, script: dict[str, Any], record: Recorder, seen: dict[str, asyncio.Event],
                    life: Life) -> None:
    after = script.get("after", "ready")
    if after == "ready":
        await server.ready.wait()
    elif after == "initialized":
        await server.initialized.wait()
    for index, step in enumerate(script.get("steps", [])):
        if "request" in step:
            try:
                result = await server.request(step["request"], step.get("params"), timeout=step.get("timeout", 30))
                record("answer", step=index, result=result)
            except RemoteError as exc:
                record("answer", step=index, error=exc.error)
            except asyncio.TimeoutError:
                record("answer", step=index, timeout=True)
        elif "requests" in step:
            calls = [server.request(method, params) for method, params in step["requests"]]
            for offset, outcome in enumerate(await asyncio.gather(*calls, return_exceptions=True)):
                if isinstance(outcome, RemoteError):
                    record("answer", step=index, item=offset, error=outcome.error)
                else:
                    record("answer", step=index, item=offset, result=outcome)
        elif "notify" in step:
            server.notify(step["notify"], step.get("params"))
        elif "raw" in step:
            server.transport.write(step["raw"].encode("utf-8", "surrogatepass") + b"\n")
        elif "sleep" in step:
            await asyncio.sleep(step["sleep"])
        elif "stderr" in step:
            life.stderr("".join(step["stderr"] + "\n" for _ in range(step.get("repeat", 1))))
        elif "wait" in step:
            count = step.get("count", 1)
            await seen.setdefault(step["wait"] if count == 1 else f"{step['wait']}#{count}", asyncio.Event()).wait()
        elif "exit" in step:
            record("exit", code=step["exit"])
            life.exit(step["exit"])
            await asyncio.Event().wait()  # a stand-in's exit returns: nothing of this script runs after it
        record("step", step=index)
    record("done")
    if "exit_after" in script:
        life.exit(script["exit_after"])


def scripted_server(script: dict[str, Any], record: Recorder, life: Life, *, transport: Transport | None = None,
                    environ: Mapping[str, str] | None = None,
                    ) -> tuple[McplServer, Callable[[McplServer], Awaitable[None]]]:
    """The server `script` describes, and the body that plays its steps beside its read loop."""
    # CLOCK_MONOTONIC is system-wide on Linux, so tests compare `t` with their own clock.
    environment = {"env": dict(environ if environ is not None else os.environ)} if script.get("record_env") else {}
    record("start", pid=life.pid, t=time.monotonic(), **environment)
    server = McplServer(script.get("name", "scripted"), script.get("manifest"), tools=script.get("tools", False),
                        transport=transport)
    seen: dict[str, asyncio.Event] = {}  # by method (first arrival) and by "method#n" (nth arrival)
    arrivals: dict[str, int] = {}

    def on_message(message: dict[str, Any]) -> None:
        record("in", message=message)
        if "method" in message:
            seen.setdefault(message["method"], asyncio.Event()).set()
            arrivals[message["method"]] = arrivals.get(message["method"], 0) + 1
            seen.setdefault(f"{message['method']}#{arrivals[message['method']]}", asyncio.Event()).set()
            if message["method"] == "initialize":
                mode = script.get("initialize", "answer")
                if mode == "exit":
                    life.exit(3)

    server.on_message = on_message
    server.on_send = lambda message: record("out", message=message)
    if script.get("initialize") == "ignore":
        server.handlers["initialize"] = lambda params: asyncio.sleep(0, NO_ANSWER)
    policy = script.get("policy")
    if policy is not None:
        answers = policy if isinstance(policy, list) else [policy]
        updates = iter(range(len(answers) - 1))

        async def receipt(params: dict[str, Any]) -> Any:
            spec = answers[next(updates, len(answers) - 1)]
            if isinstance(spec, dict) and "delay" in spec:
                await asyncio.sleep(spec["delay"])
            return answer(spec)
        server.receipt = receipt
    for method, spec in script.get("handlers", {}).items():
        answers_of = spec if isinstance(spec, list) else [spec]
        calls = iter(range(len(answers_of) - 1))

        async def handle(params: dict[str, Any], answers_of: list[Any] = answers_of, calls: Any = calls) -> Any:
            chosen = answers_of[next(calls, len(answers_of) - 1)]
            if isinstance(chosen, dict) and "delay" in chosen:
                await asyncio.sleep(chosen["delay"])
            return answer(chosen)
        server.handlers[method] = handle

    for method in script.get("notifications", []):
        async def noted(params: dict[str, Any], method: str = method) -> None:
            record("notified", method=method, params=params)
        server.notification_handlers[method] = noted

    async def body(server: McplServer) -> None:
        await run_steps(server, script, record, seen, life)

    return server, body


def main() -> None:
    if "--help" in sys.argv:
        print(USAGE)
        return
    script = load_script(os.environ)
    record = Recorder(script.get("record"))
    if script.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    server, body = scripted_server(script, record, ChildLife(), transport=Stdio())
    server.run(body)
    if script.get("ignore_eof"):
        record("eof_ignored")
        while True:
            signal.pause()


if __name__ == "__main__":
    main()
