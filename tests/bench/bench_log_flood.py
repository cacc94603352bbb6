"""Log lines a hostile connector gets out of a real `mcplhost run`.

The connector (hostile_connector.py) has an empty grant and sends STRAY
stray responses and REFUSED refused `channels/incoming` notifications (the
review's flood: 20,000 of each), then pings; the daemon is stopped with
SIGTERM once the ping is answered. Printed: the daemon's stderr lines in
all, and per 10,000 hostile lines; the hostile lines' own lines and
summaries; and how long the host took to read the flood (timed in the
connector). Then the same flood with the daemon's stderr a pipe nobody
reads: the flood is read just as fast.

Goal (the hostile-input boundary): at most 1,000 log lines for 40,000 hostile lines.

    .venv/bin/python tests/bench/bench_log_flood.py [STRAY [REFUSED]]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: How long one run may take before the benchmark gives up.
RUN_TIMEOUT_S = 120.0


def config(folder: Path, stray: int, refused: int) -> Path:
    env = {"HOSTILE_STRAY": str(stray), "HOSTILE_REFUSED": str(refused),
           "HOSTILE_RESULT": str(folder / "result.json"), "PYTHONPATH": str(REPO)}
    env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    path = folder / "mcplhost.toml"
    path.write_text(f'[store]\npath = "{folder / "host.db"}"\n\n[[connectors]]\nname = "hostile"\n'
                    f'command = [{json.dumps(sys.executable)}, {json.dumps(str(HERE / "hostile_connector.py"))}]\n'
                    f'grant = []\nenv = {{ {env_toml} }}\n')
    return path


def run(folder: Path, stray: int, refused: int, stderr: int) -> dict:
    """One daemon under the flood, stopped once its ping is answered; the connector's result."""
    result = folder / "result.json"
    result.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "MCPLHOST_CONFIG")}
    env["PYTHONPATH"] = str(REPO)
    daemon = subprocess.Popen([sys.executable, "-m", "mcplhost", "run", "--config", str(config(folder, stray, refused))],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not result.exists():  # a file another process writes: nothing to await but the file itself
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit("the flood was not read in time")
            time.sleep(0.05)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(RUN_TIMEOUT_S)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    return json.loads(result.read_text())


def fill(fd: int) -> int:
    """Fill a pipe until a write would block, so the daemon's first log line already meets a full sink."""
    os.set_blocking(fd, False)
    filled = 0
    try:
        while True:
            filled += os.write(fd, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(fd, True)  # the flag belongs to the pipe, which the daemon shares
    return filled


def main(stray: int, refused: int) -> None:
    hostile = stray + refused
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        log_path = folder / "stderr.log"
        with open(log_path, "wb") as log:
            outcome = run(folder, stray, refused, log.fileno())
        lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
        events = Counter(e["event"] for e in lines)
        suppressed = Counter()
        for e in lines:
            if e["event"] == "log.suppressed":
                suppressed[e["suppressed_event"]] += e["count"]
        print(f"hostile lines: {hostile:,} ({stray:,} stray responses, {refused:,} refused notifications)")
        print(f"log lines: {len(lines):,} in all = {len(lines) * 10_000 / hostile:.1f} per 10,000 hostile lines"
              f" (goal: at most 1,000 for 40,000)")
        for event in ("rpc.response_dropped", "connector.notification_refused"):
            print(f"  {event}: {events[event]} written, {suppressed[event]:,} counted in log.suppressed")
        print(f"  log.suppressed lines: {events['log.suppressed']}")
        print(f"flood read in {outcome['seconds']:.2f} s ({hostile / outcome['seconds']:,.0f} hostile lines/s)")
        read_fd, write_fd = os.pipe()
        try:
            filled = fill(write_fd)
            blocked = run(folder, stray, refused, write_fd)
        finally:
            os.close(write_fd)
            os.close(read_fd)
        print(f"with stderr a pipe nobody reads (filled with {filled:,} bytes before the start): flood read in"
              f" {blocked['seconds']:.2f} s, ping answered, clean stop")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    main(args[0] if args else 20_000, args[1] if len(args) > 1 else (args[0] if args else 20_000))
