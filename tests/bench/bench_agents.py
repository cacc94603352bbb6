"""Agents under load: wake latency, turn overhead, and the host's memory with 10 agents.

Three figures (README.md#performance), each bounded to well under a minute:

- wake latency: item committed → its agent's backend called, with
  `debounce_ms = 0` (so nothing is to be subtracted), 10 agents and 5
  connectors (server ids) storing 1,000 items/s, 1% of them addressed to
  one of the agents; p50/p99. Goal: p99 < 20 ms.
- turn overhead: one turn with the scripted backend (read rows, compile,
  record) over a 1,000-item context; p50/p99 per turn. Goal: < 5 ms.
- RSS of the process running the store, the group writer, the inbound
  pipeline and the agents runtime (10 agents) while 100,000 items are
  stored; sampled every 10,000. Goal: flat, < 120 MB.

The items go through the real inbound pipeline (Ingest) and the real Stored
stream; there is no connector subprocess, so the figures are the agents'
cost, not the wire's (bench_inbound_path.py measures that).

    .venv/bin/python tests/bench/bench_agents.py [latency|overhead|rss ...] [rate=ITEMS_PER_S] [seconds=S]

`rate=` and `seconds=` change the latency run's load (a loaded machine
that cannot store 1,000 items/s says so by its wall time: compare at a
rate it can).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import structlog

from mcplhost import logs
from mcplhost.agents import agent_loop as loop_module
from mcplhost.agents.backends import make_backend
from mcplhost.agents.model import ModelRequest, ModelResponse, OnText, Usage
from mcplhost.agents.tools.toolbox import ToolBox
from mcplhost.agents.turns import runner as turn_module
from mcplhost.agents.turns.row_cache import RowCache
from mcplhost.agents.turns.runner import CONTEXT_ROWS, run_turn
from mcplhost.agents.turns.turn_services import AgentState, TurnDeps
from mcplhost.agents.wakes.rules import Wake
from mcplhost.agents.wiring import build_agents
from mcplhost.config import AgentConfig, BackendConfig, Config
from mcplhost.ingest import Ingest, Stored
from mcplhost.protocol.intake import AdmittedMessage
from mcplhost.speech.echoes import EchoMemory
from mcplhost.store import open_store
from mcplhost.store.writer import GroupWriter

AGENTS = 10
CONNECTORS = 5
RATE = 1000  # items/s, all connectors together
LATENCY_SECONDS = 15
ADDRESSED_EVERY = 100  # 1% of items wake someone
CONTEXT_ITEMS = 1000
OVERHEAD_TURNS = 200
RSS_ITEMS = 100_000
RSS_BATCH = 50
RSS_SAMPLE_EVERY = 10_000
STREAM_BUFFER = 4096


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def message(n: int, body: str, *, addressed: bool, channel: str) -> AdmittedMessage:
    return AdmittedMessage(channel_id=channel, label="#" + channel.rsplit(":", 1)[-1], message_id=f"m-{n}",
                           participant=f"user{n % 37}", content=[{"type": "text", "text": body}],
                           tags=["chat:addressed", "chat:mention"] if addressed else ["chat:ambient"])


def agent(k: int) -> AgentConfig:
    """Agent k wakes on addressed items of its own channel on any connector."""
    return AgentConfig(name=f"agent{k}", wake_on=[f"c{j}/*:ch{k}" for j in range(CONNECTORS)], debounce_ms=0,
                       max_wait_ms=0, max_turns_per_hour=100_000, max_wakes_per_sender_per_hour=100_000,
                       backend=BackendConfig(kind="scripted", script=["ok"]))


class TimedBackend:
    """Scripted-like: answers at once, and notes when each call came."""

    name = "scripted"

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse:
        self.calls.append(time.perf_counter())
        return ModelResponse(text="ok", usage=Usage(input_tokens=1, output_tokens=1), model="timed")

    async def aclose(self) -> None:
        return None


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


SETTINGS = {"rate": RATE, "seconds": LATENCY_SECONDS}


async def with_runtime(folder: Path, agents: list[AgentConfig], backends: dict[str, Any], body: Any) -> Any:
    async with open_store(folder / "host.db") as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        send, receive = anyio.create_memory_object_stream[Stored](STREAM_BUFFER)
        ingest = Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox), events=send)
        runtime = build_agents(Config(agents=agents), store, writer, {}, backends=backends)
        await tg.start(runtime.run, receive)
        async with send:
            result = await body(store, ingest)
        rows = runtime.deps.rows
        if rows is not None and hasattr(rows, "stats"):
            print(f"row cache: {rows.stats}")
        tg.cancel_scope.cancel()
    return result


def serve(committed: list[float], calls: list[float]) -> list[float]:
    """Milliseconds from each call's oldest waking item not served before, to the call (each call serves all before it)."""
    latencies, pending = [], list(committed)
    for call in calls:
        served = [t for t in pending if t <= call]
        if served:
            latencies.append((call - served[0]) * 1000)
            pending = pending[len(served):]
    return latencies


async def bench_latency(folder: Path) -> None:
    agents = [agent(k) for k in range(AGENTS)]
    backends = {a.name: TimedBackend() for a in agents}
    committed: dict[str, list[float]] = {a.name: [] for a in agents}
    turn_starts: dict[str, list[float]] = {a.name: [] for a in agents}
    original = loop_module.run_turn

    async def timed_turn(agent: AgentConfig, wake: Wake, deps: TurnDeps, state: AgentState, **kwargs: Any) -> Any:
        turn_starts[agent.name].append(time.perf_counter())
        return await original(agent, wake, deps, state, **kwargs)

    loop_module.run_turn = timed_turn  # type: ignore[assignment]  # the split: scheduling vs the turn's own work

    async def body(store: Any, ingest: Ingest) -> None:
        per_connector = SETTINGS["rate"] // CONNECTORS
        count = per_connector * SETTINGS["seconds"]

        async def connector(j: int) -> None:
            start = time.perf_counter()
            for i in range(count):
                n = i * CONNECTORS + j
                addressed = n % ADDRESSED_EVERY == 0
                k = (n // ADDRESSED_EVERY) % AGENTS if addressed else n % AGENTS
                await ingest.store_messages(f"c{j}", "channels/incoming", [
                    message(n, f"message {n}", addressed=addressed,
                            channel=f"c{j}:g:ch{k}" if addressed else f"c{j}:g:general")])
                if addressed:
                    committed[f"agent{k}"].append(time.perf_counter())
                delay = start + (i + 1) / per_connector - time.perf_counter()
                if delay > 0:
                    await anyio.sleep(delay)

        async with anyio.create_task_group() as tg:
            for j in range(CONNECTORS):
                tg.start_soon(connector, j)
        await anyio.sleep(0.5)  # the last wakes' turns

    started = time.perf_counter()
    try:
        await with_runtime(folder, agents, backends, body)
    finally:
        loop_module.run_turn = original  # type: ignore[assignment]
    seconds = time.perf_counter() - started
    latencies = [ms for name in committed for ms in serve(committed[name], backends[name].calls)]
    # Each agent's first turn also stores the one-time source notice (and warms the caches): shown apart too.
    later = [ms for name in committed for ms in serve(committed[name], backends[name].calls)[1:]]
    first = [ms for name in committed for ms in serve(committed[name], backends[name].calls)[:1]]
    scheduling = [ms for name in committed for ms in serve(committed[name], turn_starts[name])]
    # Each turn makes one backend call: its start → that call is the turn's own work before the model.
    own = [(call - start) * 1000 for name in committed for start, call in zip(turn_starts[name], backends[name].calls)]
    wakes = sum(len(t) for t in committed.values())
    print(f"wake latency: {SETTINGS['rate']} items/s for {SETTINGS['seconds']} s ({seconds:.1f} s wall), {AGENTS} agents, "
          f"{CONNECTORS} connectors, {wakes} waking items, {len(latencies)} backend calls: "
          f"item committed → backend called, every turn (first turns included): "
          f"p50 {percentile(latencies, 50):.2f} ms, p99 {percentile(latencies, 99):.2f} ms, "
          f"max {max(latencies):.2f} ms (goal: p99 < 20 ms); of which commit → turn start "
          f"p50 {percentile(scheduling, 50):.2f} ms, p99 {percentile(scheduling, 99):.2f} ms, turn start → backend "
          f"called p50 {percentile(own, 50):.2f} ms, p99 {percentile(own, 99):.2f} ms; each agent's first turn alone (it stores the notice): p50 {percentile(first, 50):.2f} ms, "
          f"max {max(first):.2f} ms; without the first turns: p50 {percentile(later, 50):.2f} ms, "
          f"p99 {percentile(later, 99):.2f} ms")


async def bench_overhead(folder: Path) -> None:
    one = AgentConfig(name="solo", wake_on=["all"], backend=BackendConfig(kind="scripted", script=["noted"]))
    async with open_store(folder / "host.db") as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        ingest = Ingest(store, writer, structlog.get_logger(), echoes=EchoMemory(store.outbox))
        for start in range(0, CONTEXT_ITEMS, 50):
            await ingest.store_messages("c0", "channels/incoming", [
                message(n, f"message number {n} with a few more words in it", addressed=False, channel="c0:g:general")
                for n in range(start, start + 50)])
        last = await store.items.last_id()
        backend = make_backend(one.backend)
        deps = TurnDeps(store=store, writer=writer, handles={}, rows=RowCache(store.items, CONTEXT_ROWS))
        state = AgentState(backend=backend, toolbox=ToolBox(one, {}, store))
        wake = Wake(item_ids=(last,), overflow=0, conversations=(), several_conversations=False, first_at=0.0)
        await run_turn(one, wake, deps, state)  # the notice, once
        times: list[float] = []
        compiling: list[float] = []
        original = turn_module.compile_request

        def timed_compile(*args: Any, **kwargs: Any) -> Any:
            begin = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                compiling.append((time.perf_counter() - begin) * 1000)

        turn_module.compile_request = timed_compile  # type: ignore[assignment]  # the split: compile vs the rest
        try:
            for _ in range(OVERHEAD_TURNS):
                begin = time.perf_counter()
                await run_turn(one, wake, deps, state)
                times.append((time.perf_counter() - begin) * 1000)
        finally:
            turn_module.compile_request = original  # type: ignore[assignment]
        tg.cancel_scope.cancel()
    print(f"turn overhead (scripted, {CONTEXT_ITEMS}-item context, {OVERHEAD_TURNS} turns): "
          f"p50 {percentile(times, 50):.2f} ms, p99 {percentile(times, 99):.2f} ms, "
          f"mean {statistics.mean(times):.2f} ms (goal: < 5 ms); of which compile_request "
          f"p50 {percentile(compiling, 50):.2f} ms, p99 {percentile(compiling, 99):.2f} ms")


async def bench_rss(folder: Path) -> None:
    agents = [agent(k) for k in range(AGENTS)]
    backends = {a.name: TimedBackend() for a in agents}
    samples: list[tuple[int, float]] = [(0, rss_mb())]

    async def body(store: Any, ingest: Ingest) -> None:
        for start in range(0, RSS_ITEMS, RSS_BATCH):
            batch = []
            for n in range(start, start + RSS_BATCH):
                addressed = n % ADDRESSED_EVERY == 0
                k = (n // ADDRESSED_EVERY) % AGENTS
                batch.append(message(n, f"message {n} " + "x" * 80, addressed=addressed,
                                     channel=f"c{n % CONNECTORS}:g:ch{k}" if addressed else "c0:g:general"))
            await ingest.store_messages(f"c{start // RSS_BATCH % CONNECTORS}", "channels/incoming", batch)
            if (start + RSS_BATCH) % RSS_SAMPLE_EVERY == 0:
                samples.append((start + RSS_BATCH, rss_mb()))
        await anyio.sleep(0.5)

    started = time.perf_counter()
    await with_runtime(folder, agents, backends, body)
    seconds = time.perf_counter() - started
    calls = sum(len(b.calls) for b in backends.values())
    curve = ", ".join(f"{n // 1000}k: {mb:.0f}" for n, mb in samples)
    print(f"RSS with {AGENTS} agents over {RSS_ITEMS} items ({seconds:.1f} s, {calls} turns): MB at {curve}; "
          f"peak {max(mb for _, mb in samples):.0f} MB (goal: flat, < 120 MB)")


BENCHES = {"latency": bench_latency, "overhead": bench_overhead, "rss": bench_rss}


def main(argv: list[str]) -> None:
    logs.configure("json", "warning")
    SETTINGS.update((key, int(value)) for key, _, value in (arg.partition("=") for arg in argv if "=" in arg))
    names = [arg for arg in argv if "=" not in arg]
    for name in names or list(BENCHES):
        with tempfile.TemporaryDirectory() as folder:
            anyio.run(BENCHES[name], Path(folder))


if __name__ == "__main__":
    main(sys.argv[1:])
