"""The test suite's wall time, serial and under pytest-xdist, with the CPU it used and the machine's load.

    python tests/bench/bench_suite.py                      # the whole suite: serial, then -n 2
    python tests/bench/bench_suite.py --workers 2 tests/e2e tests/supervisor

Each run is `python -m pytest -q -p no:cacheprovider [-n N] PATHS` in a
child process, as the README's test command runs it. Wall time depends on
what else the machine runs, so the load average before and after is printed
beside it; the CPU seconds (user + system, the children included) do not,
and show what parallel workers cost on top of the serial run.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The summary line pytest -q ends with, e.g. "2061 passed, 3 skipped in 140.12s".
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed).*) in [0-9.]+s")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(paths: list[str], workers: int) -> tuple[float, float, str, int]:
    """One pytest run: its wall seconds, CPU seconds, summary and exit code."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths]
    if workers:
        command[4:4] = ["-n", str(workers)]
    cpu, began = children_cpu_s(), time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall, used = time.monotonic() - began, children_cpu_s() - cpu
    summary = next((m[1] for line in reversed(done.stdout.splitlines()) if (m := SUMMARY.match(line))),
                   done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "no output")
    return wall, used, summary, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=["tests"], help="test paths (default: the whole suite)")
    parser.add_argument("--workers", default="0,2", help="comma-separated xdist worker counts; 0 is serial")
    args = parser.parse_args()
    failed = False
    print(f"paths: {' '.join(args.paths)}; {os.cpu_count()} cores")
    print(f"{'mode':>8} {'wall s':>8} {'cpu s':>8} {'load before/after':>18}  result")
    for workers in (int(n) for n in args.workers.split(",")):
        load_before = os.getloadavg()[0]
        wall, cpu, summary, code = run(args.paths, workers)
        mode = f"-n {workers}" if workers else "serial"
        print(f"{mode:>8} {wall:8.1f} {cpu:8.1f} {load_before:8.2f} / {os.getloadavg()[0]:<7.2f}  {summary}",
              flush=True)
        failed |= code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
