"""Loop lag and `status` round trips while one long single-line answer streams in 8-character chunks.

A real Host in this process runs one agent whose `openai` backend streams its
answer from the local model server (tests/agents/llm_server.py, in a
subprocess of its own: 3 MB of one line, 8 characters a delta, 375,000
events) to a connector holding `channels.streaming`
(tests/bench/loop_connector.py, which counts the chunks it gets). While the
answer streams, tests/bench/looplag.py measures this process's event loop
and a second process asks the control socket for `status` over and over, as
`mcplhost status` does, timing each round trip. The agent's api key is set,
so each chunk is searched for a secret too. Goals (docs/agents.md#bounds):
max loop lag under 50 ms, every status round trip under 0.5 s.

    .venv/bin/python tests/bench/bench_stream_lag.py [CHARS] [--no-yield]

`--no-yield` runs the same with the stream readers' loop turns taken out
(`LoopTurns.tick` does nothing): the ratio between the two runs is what
yielding to the loop buys. Total time is mostly the SDK's own work per event
(it builds a model object for each). The longest garbage-collector pause is
printed too, so a stall can be told from a collection; on a machine shared
with other work the max lag is mostly the scheduler's (compare p99s and the
--no-yield ratio).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcplhost.agents.backends import common, make_backend  # noqa: E402
from mcplhost.agents.model import Message, ModelRequest  # noqa: E402
from mcplhost.config import (  # noqa: E402
    AgentConfig,
    BackendConfig,
    Config,
    ConnectorConfig,
    RestartConfig,
    StoreConfig,
    control_socket_path,
)
from mcplhost.host import open_host  # noqa: E402
from tests.bench.looplag import LoopLagProbe  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = [sys.executable, str(Path(__file__).with_name("loop_connector.py"))]
GRANT = ["channels.register", "channels.incoming", "channels.publish", "channels.streaming"]
CHARS = 3_000_000
CHUNK_CHARS = 8
KEY_ENV = "MCPLHOST_BENCH_STREAM_KEY"
RUN_TIMEOUT_S = 1800
LAG_GOAL_S = 0.050
STATUS_GOAL_S = 0.5

# The model server: answers the first request (the warm-up) with a few words, every later one with CHARS of "x" in
# CHUNK_CHARS deltas, until its stdin closes.
SERVER = """
import sys
sys.path.insert(0, sys.argv[1])
from tests.agents.llm_server import LlmServer, Reply
server = LlmServer(Reply(huge=int(sys.argv[2]), chunk_chars=int(sys.argv[3]))).start()
server.push(Reply(text="warm up"))
print(server.openai_base_url, flush=True)
sys.stdin.read()
server.close()
"""
# The status prober: one status request at a time, 20 ms apart; prints [wall clock sent, round trip s] per answer.
PROBE = """
import json, sys, time
from pathlib import Path
import anyio
sys.path.insert(0, sys.argv[1])
from mcplhost.control.client import ask
from mcplhost.control.wire import StatusRequest

async def main():
    while True:
        sent, begun = time.time(), time.perf_counter()
        await ask(Path(sys.argv[2]), StatusRequest(), timeout=30)
        print(json.dumps([sent, time.perf_counter() - begun]), flush=True)
        await anyio.sleep(0.02)

anyio.run(main)
"""


class GcPauses:
    """The longest pause of each garbage-collector generation while installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.longest = [0.0, 0.0, 0.0]
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            generation = info["generation"]
            self.longest[generation] = max(self.longest[generation], time.perf_counter() - self._began)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else 0.0


async def ended_turn(host: Any) -> Any:
    """The agent's turn once it has ended (polled: this is the bench's clock, not the measured loop's work)."""
    while True:
        ended = [t for t in await host.store.turns.list() if t.ended_at is not None]
        if ended:
            return ended[0]
        await anyio.sleep(0.25)


async def warm_up(backend_config: BackendConfig) -> None:
    """One short streamed call first: the SDK builds its models and imports lazily on its first answer (hundreds of
    milliseconds on the loop once), which is not what this bench measures."""
    backend = make_backend(backend_config)
    request = ModelRequest(model="m", system="", messages=[Message(role="user", content=[{"type": "text",
                                                                                          "text": "hi"}])])
    await backend.complete(request, on_text=lambda _: None)
    await backend.aclose()


async def measure(folder: Path, chars: int, base_url: str) -> None:
    result = folder / "loop.json"
    connector = ConnectorConfig(
        name="loop", command=CONNECTOR, cwd=str(REPO), grant=GRANT, restart=RestartConfig(policy="never"),
        env={"PYTHONPATH": str(REPO), "LOOP_ROUNDS": "1", "LOOP_STREAMING": "1", "LOOP_RESULT": str(result),
             "LOOP_TIMEOUT_S": str(RUN_TIMEOUT_S)})
    backend = BackendConfig(kind="openai", model="m", base_url=base_url, api_key_env=KEY_ENV,
                            timeout_s=RUN_TIMEOUT_S, max_retries=0, max_tokens=1024)
    await warm_up(backend)
    agent = AgentConfig(name="bot", wake_on=["all"], debounce_ms=0, max_output_chars=chars + 1, backend=backend)
    config = Config(store=StoreConfig(path=str(folder / "bench.db")), connectors=[connector], agents=[agent])
    stop = anyio.Event()
    pauses = GcPauses()
    async with open_host(config) as host, anyio.create_task_group() as tg:
        tg.start_soon(host.run, stop)
        with anyio.fail_after(60):
            await host.ready.wait()
        # Its answers go to a file: a pipe nobody reads until the end would fill and stop the prober.
        with (folder / "status.jsonl").open("w") as answers_file:
            probe_process = subprocess.Popen(
                [sys.executable, "-c", PROBE, str(REPO), str(control_socket_path(config))], stdout=answers_file)
        try:
            gc.callbacks.append(pauses)
            async with LoopLagProbe() as probe:
                with anyio.fail_after(RUN_TIMEOUT_S):
                    turn = await ended_turn(host)
                    while not result.exists():  # the connector writes it once the publish arrived
                        await anyio.sleep(0.25)
        finally:
            gc.callbacks.remove(pauses)
            probe_process.terminate()
            probe_process.wait(timeout=30)
            stop.set()
    answers = (folder / "status.jsonl").read_text()
    answers = answers[: answers.rfind("\n") + 1]  # the prober may have been stopped mid-line
    started_s, ended_s = turn.started_at / 1000, turn.ended_at / 1000
    trips = [rtt for sent, rtt in map(json.loads, answers.splitlines()) if started_s <= sent <= ended_s]
    streamed = json.loads(result.read_text())
    print(f"turn {turn.outcome} in {ended_s - started_s:.1f} s: {chars:,} characters in {chars // CHUNK_CHARS:,} "
          f"events; the connector got {streamed.get('chunks', 0):,} chunks, "
          f"{streamed.get('streamed_chars', 0):,} characters")
    worst = probe.lags_s.index(probe.max_s) / max(1, len(probe.lags_s) - 1)
    print(probe.summary() + f", the max at {worst:.0%} of the turn (goal: max under {LAG_GOAL_S * 1000:.0f} ms)")
    print("longest garbage-collector pause by generation: "
          + ", ".join(f"{g}: {p * 1000:.1f} ms" for g, p in enumerate(pauses.longest)))
    print(f"status round trips during the stream: {len(trips)}, p50 {percentile(trips, 50) * 1000:.1f} ms, "
          f"p99 {percentile(trips, 99) * 1000:.1f} ms, max {max(trips, default=0) * 1000:.1f} ms "
          f"(goal: under {STATUS_GOAL_S * 1000:.0f} ms)")


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    chars = int(args[0]) if args else CHARS
    if "--no-yield" in sys.argv:
        async def no_turn(self: common.LoopTurns) -> None:
            return None

        common.LoopTurns.tick = no_turn  # type: ignore[method-assign]
        print("the stream readers do not yield to the loop (--no-yield)")
    structlog.configure(logger_factory=structlog.WriteLoggerFactory(open(os.devnull, "w")),  # noqa: SIM115
                        processors=[structlog.processors.JSONRenderer()])
    os.environ[KEY_ENV] = "sk-bench-stream-0123456789"
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(REPO), str(chars), str(CHUNK_CHARS)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        base_url = server.stdout.readline().strip()  # type: ignore[union-attr]
        with tempfile.TemporaryDirectory(prefix="bench-stream-") as folder:
            began = time.perf_counter()
            anyio.run(measure, Path(folder), chars, base_url)
            print(f"whole run {time.perf_counter() - began:.1f} s")
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
