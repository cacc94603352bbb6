"""The cost of one `mcplhost status` call with 50 connectors and 10,000 registered channels.

A real `mcplhost run` (subprocess) hosts 50 scripted connectors, each
registering 200 channels; once all 10,000 are registered, the bench times
STATUS_CALLS status requests the way the command makes them (connect to the
control socket, send the request, read the answer, decode the status object)
and prints p50, p99 and max. Goal (README.md#performance): under 20 ms.

    .venv/bin/python tests/bench/bench_status.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcplhost.control.client import NoDaemon, ask  # noqa: E402
from mcplhost.control.status import Status  # noqa: E402
from mcplhost.control.wire import StatusRequest  # noqa: E402
from tests.cli.support import cli_env, scripted_connector, write_config  # noqa: E402
from tests.harness import CHAT_GRANT, CHAT_MANIFEST, PYTHON, REPO  # noqa: E402

CONNECTORS = 50
CHANNELS_EACH = 200  # 10,000 in all
STATUS_CALLS = 200
#: How long the 50 connectors may take to start and register on a loaded 2-core machine.
SETTLE_S = 180.0


def register(connector: int) -> dict:
    return {"request": "channels/register", "params": {"channels": [
        {"id": f"c{connector}:room-{n}", "type": "chat", "direction": "bidirectional", "address": {},
         "label": f"#room-{n}"} for n in range(CHANNELS_EACH)]}}


async def status(path: Path) -> Status:
    answer = await ask(path, StatusRequest())
    return msgspec.json.decode(bytes(answer.status), type=Status)  # type: ignore[arg-type]


async def measure(folder: Path) -> None:
    config = write_config(folder, [
        scripted_connector(f"c{i}", {"manifest": CHAT_MANIFEST, "steps": [register(i)]}, folder, grant=CHAT_GRANT)
        for i in range(CONNECTORS)])
    path = folder / "mcplhost.sock"
    with open(folder / "run.log", "wb") as log:
        daemon = await anyio.open_process([PYTHON, "-m", "mcplhost", "run", "--config", str(config)],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                          env=cli_env(), cwd=REPO)
    try:
        started = time.monotonic()
        while True:  # settling, not measuring: look twice a second
            try:
                settled = await status(path)
                if sum(c.channels for c in settled.connectors) == CONNECTORS * CHANNELS_EACH:
                    break
            except NoDaemon:
                pass  # not listening yet
            if time.monotonic() - started > SETTLE_S:
                raise SystemExit("the connectors did not all register in time")
            await anyio.sleep(0.5)
        print(f"{CONNECTORS} connectors ready, {CONNECTORS * CHANNELS_EACH} channels registered "
              f"after {time.monotonic() - started:.1f} s")
        answer_bytes = len(bytes((await ask(path, StatusRequest())).status))  # type: ignore[arg-type]
        timings = []
        for _ in range(STATUS_CALLS):
            begun = time.perf_counter()
            await status(path)
            timings.append((time.perf_counter() - begun) * 1000)
        timings.sort()
        p99 = timings[int(len(timings) * 0.99) - 1]
        print(json.dumps({"calls": STATUS_CALLS, "answer_bytes": answer_bytes,
                          "p50_ms": round(statistics.median(timings), 2), "p99_ms": round(p99, 2),
                          "max_ms": round(timings[-1], 2), "goal_ms": 20}))
    finally:
        daemon.terminate()
        with anyio.fail_after(60):
            await daemon.wait()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-status-") as folder:
        anyio.run(measure, Path(folder))


if __name__ == "__main__":
    main()
