"""Benchmark mark_openings: the budget cases of docs/provenance.md §4 and §4a, and linear growth.

Run: .venv/bin/python tests/bench/bench_mark.py
Exits 1 when a budget case takes 100 ms or more (best of several runs). Also prints the 1 MiB body of
100,000 look-alike openings (docs/provenance.md §4a) as a ratio to the same body of plain openings, both
measured in the same run.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from mcplhost.inbound import mark_openings
from mcplhost.inbound.lookalikes import forms

BUDGET_S = 0.100
RUNS = 7
MIB = 1 << 20


def one_block(text: str) -> list[dict]:
    return [{"type": "text", "text": text}]


def dense_openings(scale: int = 1) -> list[dict]:
    """1 MiB (times scale) holding 100,000 (times scale) openings."""
    return one_block(("[source: x]" * 100_000 * scale).ljust(MIB * scale, "y"))


def lookalike_opening(n: int) -> str:
    """The n-th of a run of look-alike openings, each 11 characters like `[source: x]`: every character of
    `[source:` and `]` drawn in turn from what reads as it (docs/provenance.md §4a), so all of them occur."""
    def pick(char: str, step: int) -> str:
        chars = forms(char)
        return chars[(n * step + 1) % len(chars)]
    end = pick(":", 5) if n % 2 else pick("]", 5)
    return pick("[", 1) + "".join(pick(c, 2 + i) for i, c in enumerate("source")) + end + " x" + pick("]", 3)


def dense_lookalike_openings(scale: int = 1) -> list[dict]:
    """The same size as `dense_openings`, every opening in look-alike characters."""
    return one_block("".join(lookalike_opening(n) for n in range(100_000 * scale)).ljust(MIB * scale, "y"))


def many_brackets(scale: int = 1) -> list[dict]:
    """200,000 `[` in a row, then one opening."""
    return one_block("[" * 200_000 * scale + "[source: x]")


def unfinished_openings(scale: int = 1) -> list[dict]:
    """100,000 openings that stop one letter short."""
    return one_block("[sourc" * 100_000 * scale)


def zero_width_inside(scale: int = 1) -> list[dict]:
    """One opening with 300,000 zero-width characters between `[` and the word."""
    return one_block("[" + "\u200b" * 300_000 * scale + "source: x]")


def split_across_blocks(scale: int = 1) -> list[dict]:
    """20,000 openings, each split over two blocks with an image between (about 1 MiB as JSON)."""
    image = {"type": "image", "uri": "https://example.com/i.png"}
    blocks: list[dict] = []
    for _ in range(20_000 * scale):
        blocks += [{"type": "text", "text": "hi [sou"}, image, {"type": "text", "text": "rce: x] "}]
    return blocks


Case = tuple[str, Callable[[int], list[dict]]]

# The bodies docs/provenance.md §4 and the issue name, each with a 100 ms budget.
BUDGET_CASES: list[Case] = [
    ("1 MiB body, 100,000 openings", dense_openings),
    ("1 MiB body, 100,000 look-alike openings", dense_lookalike_openings),
    ("200,000 '[' then one opening", many_brackets),
    ("100,000 unfinished '[sourc'", unfinished_openings),
    ("one opening, 300,000 zero-width chars", zero_width_inside),
]
# Measured for linearity only: per-block costs dominate, not the scan.
EXTRA_CASES: list[Case] = [
    ("20,000 openings split over 60,000 blocks", split_across_blocks),
]


def timed(blocks: list[dict]) -> tuple[float, float]:
    """Best and median seconds over RUNS runs."""
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        mark_openings(blocks)
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times)


def main() -> int:
    started = time.perf_counter()
    mark_openings(one_block("[source]"))
    print(f"first call (derives the pattern's classes): {(time.perf_counter() - started) * 1000:.0f} ms\n")

    over_budget = []
    print(f"budget cases (best / median of {RUNS}; budget {BUDGET_S * 1000:.0f} ms)")
    for name, build in BUDGET_CASES:
        best, median = timed(build(1))
        verdict = "ok" if best < BUDGET_S else "OVER BUDGET"
        if best >= BUDGET_S:
            over_budget.append(name)
        print(f"  {name:40} {best * 1000:7.1f} ms / {median * 1000:7.1f} ms  {verdict}")
    for name, build in EXTRA_CASES:
        best, median = timed(build(1))
        print(f"  {name:40} {best * 1000:7.1f} ms / {median * 1000:7.1f} ms  (no budget)")

    plain, lookalike = (timed(build(1))[0] for build in (dense_openings, dense_lookalike_openings))
    print(f"\nlook-alike openings / plain openings, 1 MiB each: {lookalike * 1000:.1f} ms / {plain * 1000:.1f} ms"
          f" = {lookalike / plain:.2f}")

    print("\nlinear growth (best of runs at 1x, 2x, 4x; linear gives ratios near 2 and 4, quadratic 4 and 16)")
    for name, build in BUDGET_CASES + EXTRA_CASES:
        t1, t2, t4 = (timed(build(scale))[0] for scale in (1, 2, 4))
        print(
            f"  {name:40} 1x {t1 * 1000:7.1f} ms  2x {t2 * 1000:7.1f} ms  4x {t4 * 1000:7.1f} ms"
            f"  ratios {t2 / t1:4.2f} {t4 / t1:4.2f}"
        )

    if over_budget:
        print(f"\nOVER BUDGET: {', '.join(over_budget)}")
        return 1
    print("\nall budget cases under budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
