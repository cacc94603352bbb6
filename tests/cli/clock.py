"""A stepped clock for MCPL_TEST_CLOCK (mcplhost/connectors/mcpl_server.py `timed_steps`): time that jumps.

    with SteppedClock(tmp_path / "clock.sock", parties=4) as clock:
        clock.settled = lambda: ...          # may the clock move on now?
        ... run dev with MCPL_TEST_CLOCK=clock.path ...

Each timed scenario (a stub's steps, dev's `--seconds` deadline) holds one
connection and sends the seconds its next step waits. The clock's time moves
only to the earliest waiting step, and only when every party has come with
its first step (a connection alone is not enough: its first step may still
be on its way), no released step is still running (its scenario has not
asked for its next one), and `settled()` holds: for the dev snapshot, when
everything the steps so far caused is in the live view. So the steps come in
the order their timings give, each after the work of the one before, without
wall time.

When `settled()` does not hold within PATIENCE_S (what the steps caused is
not what the test expects), the clock stops waiting for it, from then on,
so the run ends soon and the test fails on what it compares instead of
hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: How long the clock waits for `settled()` before it moves on regardless.
PATIENCE_S = 3.0
#: How long starting and stopping the clock's thread may take.
THREAD_S = 10.0


@dataclass(order=True)
class Waiting:
    at: float
    seq: int
    go: asyncio.Event = field(compare=False, default_factory=asyncio.Event)


class SteppedClock:
    def __init__(self, path: Path, *, parties: int) -> None:
        self.path = path
        self.parties = parties
        self.settled: Callable[[], bool] = lambda: True
        self.now = 0.0
        #: (the step's time, the seconds it asked for), in the order the clock released them.
        self.released: list[tuple[float, float]] = []
        self.impatient = False  # `settled()` did not hold in time once: no longer asked
        self._come = 0  # parties that sent their first step (or ended without one)
        self._running = 0  # released steps whose scenario has not asked for its next one yet
        self._waiting: list[Waiting] = []
        self._parties: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._seq = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._changed: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="stepped-clock", daemon=True)

    def __enter__(self) -> SteppedClock:
        self._thread.start()
        assert self._started.wait(THREAD_S), "the stepped clock did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(THREAD_S)
        assert not self._thread.is_alive(), "the stepped clock did not stop"

    def poke(self) -> None:
        """Something `settled()` reads has changed (callable from any thread)."""
        self._loop.call_soon_threadsafe(self._poke)

    def _poke(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        server = await asyncio.start_unix_server(self._party, path=str(self.path))
        self._started.set()
        pacer = asyncio.create_task(self._pace())
        try:
            await self._stop.wait()
        finally:
            server.close()
            pacer.cancel()
            for step in self._waiting:  # its turn never comes: let it see the connection end instead
                step.go.set()
            for writer in self._writers:
                writer.close()
            await asyncio.gather(pacer, *self._parties, return_exceptions=True)
            await server.wait_closed()

    async def _party(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One scenario: each line ends its running step (if any) and waits for the next one's turn."""
        task = asyncio.current_task()
        assert task is not None
        self._parties.add(task)
        self._writers.add(writer)
        released = False
        waiting: Waiting | None = None
        come = False
        try:
            while line := await reader.readline():
                if not come:  # a party has come with its first step, not with its connection
                    come = True
                    self._come += 1
                if released:
                    self._running -= 1
                    released = False
                waiting = Waiting(self.now + float(line), next(self._seq))
                self._waiting.append(waiting)
                self._poke()
                await waiting.go.wait()
                waiting = None
                released = True
                writer.write(b"go\n")
                await writer.drain()
        except (ConnectionError, ValueError):
            pass
        finally:
            if not come:  # a scenario with no step at all
                self._come += 1
            if released or (waiting is not None and waiting.go.is_set()):
                self._running -= 1
            if waiting is not None and waiting in self._waiting:
                self._waiting.remove(waiting)
            self._parties.discard(task)
            self._writers.discard(writer)
            self._poke()
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _pace(self) -> None:
        assert self._changed is not None
        while True:
            self._changed.clear()
            if self._come >= self.parties and self._waiting and not self._running:
                if self.impatient or self.settled():
                    self._release()
                    continue
                try:
                    await asyncio.wait_for(self._changed.wait(), PATIENCE_S)
                except TimeoutError:
                    self.impatient = True
                continue
            await self._changed.wait()

    def _release(self) -> None:
        step = min(self._waiting)
        self._waiting.remove(step)
        self.released.append((step.at, step.at - self.now))
        self.now = step.at
        self._running += 1
        step.go.set()
