"""The test suite's wall time by the README's command (`python -m pytest -q -n 3`), its CPU, the machine's load,
and the slowest tests.

    python tests/bench/bench_suite.py                      # the whole suite, -n 3, as the README runs it
    python tests/bench/bench_suite.py --workers 0,3        # serial, then -n 3
    python tests/bench/bench_suite.py --workers 2 tests/e2e tests/supervisor

Each run is `python -m pytest -q -p no:cacheprovider [-n N] --durations=15 PATHS`
in a child process. Wall time depends on what else the machine runs, so the
load average before and after is printed beside it; the CPU seconds (user +
system, the children included) do not, and show what parallel workers cost
on top of the serial run. The 15 slowest tests of each run, then any that
failed, follow its line
(HYPOTHESIS_PROFILE=deep, passed on, makes the properties search harder:
tests/properties.py).
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
#: The slowest tests each run lists.
SLOWEST = 15
#: A line of pytest's durations list, e.g. "35.03s call     tests/e2e/test_x.py::test_y".
DURATION = re.compile(r"^\d+\.\d+s (?:call|setup|teardown) ")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(paths: list[str], workers: int) -> tuple[float, float, str, list[str], int]:
    """One pytest run: its wall seconds, CPU seconds, summary, slowest tests (then any failed) and exit code."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--durations={SLOWEST}", *paths]
    if workers:
        command[4:4] = ["-n", str(workers)]
    cpu, began = children_cpu_s(), time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall, used = time.monotonic() - began, children_cpu_s() - cpu
    lines = done.stdout.splitlines()
    summary = next((m[1] for line in reversed(lines) if (m := SUMMARY.match(line))),
                   lines[-1] if lines else "no output")
    slowest = [line for line in lines if DURATION.match(line)][:SLOWEST]
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return wall, used, summary, slowest + failed, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=["tests"], help="test paths (default: the whole suite)")
    parser.add_argument("--workers", default="3", help="comma-separated xdist worker counts; 0 is serial")
    args = parser.parse_args()
    failed = False
    print(f"paths: {' '.join(args.paths)}; {os.cpu_count()} cores")
    print(f"{'mode':>8} {'wall s':>8} {'cpu s':>8} {'load before/after':>18}  result")
    for workers in (int(n) for n in args.workers.split(",")):
        load_before = os.getloadavg()[0]
        wall, cpu, summary, slowest, code = run(args.paths, workers)
        mode = f"-n {workers}" if workers else "serial"
        print(f"{mode:>8} {wall:8.1f} {cpu:8.1f} {load_before:8.2f} / {os.getloadavg()[0]:<7.2f}  {summary}",
              flush=True)
        print("\n".join(f"{'':>10}{line}" for line in slowest), flush=True)
        failed |= code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
