"""A loop-lag probe for benchmarks: how long the event loop was unable to run a task.

The probe sleeps `interval_s` over and over on the loop it measures; each
wake-up's overshoot past its deadline is one sample of how long something
else held the loop. `max_s` is the longest stall seen, `p99_s` the tail.

    async with LoopLagProbe() as probe:
        ...  # the work under test, on the same loop
    print(probe.summary())
"""

from __future__ import annotations

import time
from types import TracebackType

import anyio


class LoopLagProbe:
    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.lags_s: list[float] = []
        self._group: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> LoopLagProbe:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(self._sample)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> bool | None:
        assert self._group is not None
        self._group.cancel_scope.cancel()
        return await self._group.__aexit__(kind, error, trace)

    async def _sample(self) -> None:
        while True:
            due = time.perf_counter() + self.interval_s
            await anyio.sleep(self.interval_s)
            self.lags_s.append(max(0.0, time.perf_counter() - due))

    @property
    def max_s(self) -> float:
        return max(self.lags_s, default=0.0)

    @property
    def p99_s(self) -> float:
        if not self.lags_s:
            return 0.0
        ordered = sorted(self.lags_s)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    def summary(self) -> str:
        return (f"loop lag over {len(self.lags_s)} samples: p99 {self.p99_s * 1000:.1f} ms, "
                f"max {self.max_s * 1000:.1f} ms")
