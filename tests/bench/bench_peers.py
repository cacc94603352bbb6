"""The peer throttles (mcplhost/peers/admission.py): decisions per second with full maps, and their memory bound.

Two figures (README.md#performance), pure Python with no I/O: decisions takes
about 10 s, memory about a minute (tracemalloc slows every allocation).

- decisions: 100 agents, every ordered pair seeded with PAIR_MAX sends spread
  over the last PAIR_WINDOW_MS (so every target holds 99 × PAIR_MAX, far past
  TARGET_MAX: the fullest a seed can make the maps), then DECISIONS `check`
  calls over random ordered pairs, time moving 1 ms per call, each admitted
  send recorded as the service does. The mix comes from the inputs: a quarter
  of the sends repeat their pair's one fixed text (duplicate candidates),
  `queued` is uniform in 0..QUEUE_MAX and `consecutive_wakes` in
  0..CONSECUTIVE_WAKES_MAX, so once the windows have room one send in eleven
  meets `queue_full` and about a quarter `needs_attention`. The first
  PAIR_WINDOW_MS of calls meet the seeded windows (all `rate_limited`); after
  that each target admits up to TARGET_MAX per TARGET_WINDOW_MS. Printed:
  decisions/s over all calls and over the full-window phase alone, and the
  verdict mix.
- memory: SENDS sends across PAIRS ordered pairs (each pair its own target,
  so the pair window binds and nearly every send is admitted: the most state
  this send rate can leave), time moving SEND_STEP_MS per send, check then
  record when admitted; a tenth repeat their pair's previous text. Printed at
  checkpoints: `entries()` and tracemalloc's current size of the state, and
  the peak over the run. Bounded means the later checkpoints match the one
  at 100,000 sends (already past LONGEST_WINDOW_MS of sends).

    .venv/bin/python tests/bench/bench_peers.py [decisions|memory ...]
"""

from __future__ import annotations

import collections
import random
import sys
import time
import tracemalloc
from collections.abc import Callable

from mcplhost.peers.admission import ADMIT, Throttles, Verdict, text_key
from mcplhost.peers.limits import CONSECUTIVE_WAKES_MAX, LONGEST_WINDOW_MS, PAIR_MAX, PAIR_WINDOW_MS, QUEUE_MAX

AGENTS = 100
DECISIONS = 400_000
DECISION_STEP_MS = 1
DUPLICATE_SHARE = 0.25
RUNS = 3

PAIRS = 10_000
SENDS = 1_000_000
SEND_STEP_MS = 2
REPEAT_EVERY = 10
CHECKPOINTS = (100_000, 250_000, 500_000, 750_000, 1_000_000)

#: An arbitrary epoch-milliseconds start.
T0 = 1_790_000_000_000


def seeded(agents: list[str], rng: random.Random) -> Throttles:
    """Every ordered pair holding PAIR_MAX sends within the window that ends at T0."""
    throttles = Throttles()
    throttles.seed((sender, target, text_key(f"seed {sender} {target} {n}"), T0 - rng.randrange(PAIR_WINDOW_MS))
                   for sender in agents for target in agents if sender != target for n in range(PAIR_MAX))
    return throttles


def decisions() -> None:
    rng = random.Random(7)
    agents = [f"agent-{n:02}" for n in range(AGENTS)]
    fixed = {(s, t): text_key(f"again {s} {t}") for s in agents for t in agents}
    inputs = []
    for n in range(DECISIONS):
        sender, target = rng.sample(agents, 2)
        key = fixed[sender, target] if rng.random() < DUPLICATE_SHARE else text_key(f"new {n}")
        inputs.append((sender, target, key, T0 + n * DECISION_STEP_MS,
                       rng.randint(0, QUEUE_MAX), rng.randint(0, CONSECUTIVE_WAKES_MAX)))
    full_phase = PAIR_WINDOW_MS // DECISION_STEP_MS
    print(f"decisions: {AGENTS} agents, every ordered pair seeded with {PAIR_MAX} sends in the window; "
          f"{DECISIONS:,} checks, {DECISION_STEP_MS} ms apart ({RUNS} runs)")
    mix: collections.Counter[tuple[str, str | None]] = collections.Counter()
    for run in range(RUNS):
        throttles = seeded(agents, random.Random(run))
        check, record = throttles.check, throttles.record
        verdicts: list[Verdict] = []
        keep = verdicts.append
        started = time.perf_counter()
        for index, (sender, target, key, now_ms, queued, wakes) in enumerate(inputs):
            verdict = check(sender, target, key, now_ms, queued=queued, consecutive_wakes=wakes)
            if verdict is ADMIT:
                record(sender, target, key, now_ms)
            keep(verdict)
            if index == full_phase - 1:
                full_seconds = time.perf_counter() - started
        seconds = time.perf_counter() - started
        mix = collections.Counter((v.status, v.reason) for v in verdicts)
        print(f"  run {run + 1}: {DECISIONS / seconds:,.0f} decisions/s over all checks; "
              f"{full_phase / full_seconds:,.0f}/s over the first {full_phase:,} (seeded windows full)")
    shares = ", ".join(f"{status}{'/' + reason if reason else ''} {count / DECISIONS:.1%}"
                       for (status, reason), count in mix.most_common())
    print(f"  mix: {shares}")


def memory() -> None:
    rng = random.Random(11)
    senders = [f"agent-{n:03}" for n in range(100)]
    pairs = [(senders[n % len(senders)], f"target-{n:05}") for n in range(PAIRS)]
    last_text = [""] * PAIRS
    print(f"memory: {SENDS:,} sends over {PAIRS:,} pairs (each its own target), {SEND_STEP_MS} ms apart, "
          f"a 1/{REPEAT_EVERY} repeat their pair's previous text")
    tracemalloc.start()
    baseline = tracemalloc.get_traced_memory()[0]
    throttles = Throttles()
    admitted = 0
    started = time.perf_counter()
    for n in range(1, SENDS + 1):
        index = rng.randrange(PAIRS)
        sender, target = pairs[index]
        text = last_text[index] if n % REPEAT_EVERY == 0 else f"message {n}"
        key = text_key(text)
        now_ms = T0 + n * SEND_STEP_MS
        if throttles.check(sender, target, key, now_ms, queued=0, consecutive_wakes=0) is ADMIT:
            throttles.record(sender, target, key, now_ms)
            admitted += 1
        last_text[index] = text
        if n in CHECKPOINTS:
            current = tracemalloc.get_traced_memory()[0] - baseline
            print(f"  after {n:>9,} sends ({admitted:,} admitted): entries() {throttles.entries():>7,}, "
                  f"current {current / 2**20:6.1f} MiB")
    peak = tracemalloc.get_traced_memory()[1] - baseline
    tracemalloc.stop()
    seconds = time.perf_counter() - started
    within = LONGEST_WINDOW_MS // SEND_STEP_MS
    print(f"  peak {peak / 2**20:.1f} MiB; the longest window spans {within:,} sends; "
          f"{seconds:.1f} s under tracemalloc")


BENCHES: dict[str, Callable[[], None]] = {"decisions": decisions, "memory": memory}


def main(argv: list[str]) -> None:
    for name in argv or list(BENCHES):
        BENCHES[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
