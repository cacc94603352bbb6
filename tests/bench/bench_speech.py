"""Speech under load: publishes/s through the outbox, the outbox's added latency, and the whole loop.

Three figures (README.md#performance), each against a real connector subprocess
(tests/bench/loop_connector.py, answering every `channels/publish` at once)
under a real Host, each bounded to well under a minute:

- throughput: PUBLISHES publishes queued at once (PublishSpeech through the
  group writer, the sender notified), until the last is answered; publishes/s.
- added latency: one publish at a time, queued → its answer committed, beside
  a direct `channels/publish` Request on the same connection (alternating);
  p50/p99 of each and of the difference. Goal: the outbox's p99 under 10 ms
  above the direct one.
- whole loop: the connector sends a mention, a scripted agent (debounce 0)
  answers, and the connector times mention sent → publish received; p50/p99.
  Goal: p99 under 30 ms.

    .venv/bin/python tests/bench/bench_speech.py [throughput|latency|loop ...]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from mcplhost import logs
from mcplhost.agents.turns.agent_rows import speech_row
from mcplhost.config import AgentConfig, BackendConfig, Config, ConnectorConfig, RestartConfig, StoreConfig
from mcplhost.host import Host, open_host
from mcplhost.speech.routing import Destination
from mcplhost.store.operations import PublishSpeech
from mcplhost.store.outbox import OutboxEntry

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = [sys.executable, str(Path(__file__).with_name("loop_connector.py"))]
GRANT = ["channels.register", "channels.incoming", "channels.publish"]
CHANNEL = "bench:loop:room"
DESTINATION = Destination(server_id="loop", channel_id=CHANNEL)
PUBLISHES = 2000
LATENCY_ROUNDS = 300
LOOP_ROUNDS = 200
READY_TIMEOUT_S = 30
RUN_TIMEOUT_S = 120


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def figures(values_ms: list[float]) -> str:
    return f"p50 {percentile(values_ms, 50):.2f} ms, p99 {percentile(values_ms, 99):.2f} ms"


def connector(**env: str) -> ConnectorConfig:
    return ConnectorConfig(name="loop", command=CONNECTOR, env={"PYTHONPATH": str(REPO), **env}, cwd=str(REPO),
                           grant=GRANT, restart=RestartConfig(policy="never"))


class Delivered(dict):
    """The sender's stats, calling back whenever its delivered count moves (so the bench awaits, never polls)."""

    def __init__(self, stats: dict[str, int], on_delivered: Callable[[int], None]) -> None:
        super().__init__(stats)
        self.on_delivered = on_delivered

    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)
        if key == "delivered":
            self.on_delivered(value)


@asynccontextmanager
async def running(folder: Path, *connectors: ConnectorConfig, agents: list[AgentConfig] | None = None,
                  ) -> AsyncIterator[Host]:
    config = Config(store=StoreConfig(path=str(folder / "bench.db")), connectors=list(connectors),
                    agents=agents or [])
    stop = anyio.Event()
    async with open_host(config) as host, anyio.create_task_group() as tg:
        tg.start_soon(host.run, stop)
        with anyio.fail_after(READY_TIMEOUT_S):
            await host.ready.wait()
            await host.connectors["loop"].wait_ready()
        try:
            yield host
        finally:
            stop.set()


def publish(n: int) -> PublishSpeech:
    now = time.time_ns() // 1_000_000
    entry = OutboxEntry(agent="bench", turn_id=None, server_id="loop", channel_id=CHANNEL, thread_id=None,
                        conversation_id=DESTINATION.conversation_id(), text=f"reply {n}", created_at=now)
    return PublishSpeech(speech=speech_row("bench", None, f"reply {n}", DESTINATION, created_at=now), entries=[entry])


def watch(host: Host, target: Callable[[], int], reached: Callable[[], None]) -> None:
    sender = host.outbox_senders["loop"]

    def on_delivered(count: int) -> None:
        if count >= target():
            reached()

    sender.stats = Delivered(sender.stats, on_delivered)


async def bench_throughput(folder: Path) -> None:
    async with running(folder, connector()) as host:
        done = anyio.Event()
        watch(host, lambda: PUBLISHES, done.set)
        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for n in range(PUBLISHES):
                tg.start_soon(host.writer.submit, publish(n))
        host.outbox_senders["loop"].notify()
        with anyio.fail_after(RUN_TIMEOUT_S):
            await done.wait()
        seconds = time.perf_counter() - started
    print(f"throughput: {PUBLISHES} publishes through the outbox in {seconds:.2f} s: "
          f"{PUBLISHES / seconds:.0f} publishes/s")


async def bench_latency(folder: Path) -> None:
    direct: list[float] = []
    outbox: list[float] = []
    async with running(folder, connector()) as host:
        handle, sender = host.connectors["loop"], host.outbox_senders["loop"]
        expected = [0]
        arrived = [anyio.Event()]
        watch(host, lambda: expected[0], lambda: arrived[0].set())
        params = {"conversationId": DESTINATION.conversation_id(), "channelId": CHANNEL, "stream": False,
                  "content": [{"type": "text", "text": "direct"}]}
        with anyio.fail_after(RUN_TIMEOUT_S):
            for n in range(LATENCY_ROUNDS):
                begin = time.perf_counter()
                await handle.request("channels/publish", params)
                direct.append((time.perf_counter() - begin) * 1000)
                expected[0], arrived[0] = n + 1, anyio.Event()
                begin = time.perf_counter()
                await host.writer.submit(publish(n))
                sender.notify()
                await arrived[0].wait()
                outbox.append((time.perf_counter() - begin) * 1000)
    added = [o - d for o, d in zip(outbox, direct, strict=True)]
    print(f"latency ({LATENCY_ROUNDS} publishes, one at a time): direct channels/publish {figures(direct)}; "
          f"through the outbox {figures(outbox)}; added p50 {percentile(outbox, 50) - percentile(direct, 50):.2f} ms,"
          f" p99 {percentile(outbox, 99) - percentile(direct, 99):.2f} ms (per pair: {figures(added)}; "
          f"mean {statistics.mean(added):.2f} ms) (goal: p99 < 10 ms)")


async def bench_loop(folder: Path) -> None:
    result = folder / "loop.json"
    bot = AgentConfig(name="bot", wake_on=["addressed"], debounce_ms=0, max_wait_ms=0, max_turns_per_hour=100_000,
                      max_wakes_per_sender_per_hour=100_000, backend=BackendConfig(kind="scripted", script=["ok"]))
    loop = connector(LOOP_ROUNDS=str(LOOP_ROUNDS), LOOP_RESULT=str(result))
    async with running(folder, loop, agents=[bot]):
        with anyio.fail_after(RUN_TIMEOUT_S):
            while not result.exists():
                await anyio.sleep(0.1)  # another process writes it; nothing here to await
    latencies = [s * 1000 for s in json.loads(result.read_text(encoding="utf-8"))["latencies_s"]]
    # The first round's turn also stores the agent's one-time notice and warms the caches (as in bench_agents).
    print(f"whole loop ({LOOP_ROUNDS} rounds: mention in → reply published, scripted, debounce 0): "
          f"{figures(latencies)}, mean {statistics.mean(latencies):.2f} ms; without the first round "
          f"{figures(latencies[1:])} (goal: p99 < 30 ms)")


BENCHES = {"throughput": bench_throughput, "latency": bench_latency, "loop": bench_loop}


def main(argv: list[str]) -> None:
    logs.configure("json", "warning")
    for name in argv or list(BENCHES):
        with tempfile.TemporaryDirectory() as folder:
            anyio.run(BENCHES[name], Path(folder))


if __name__ == "__main__":
    main(sys.argv[1:])
