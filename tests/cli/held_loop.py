"""`mcplhost` with a test's hand on its event loop: `python -m tests.cli.held_loop run --config PATH`.

With HELD_LOOP_FILE naming a file, a task on the daemon's event loop waits
for that file to appear, then blocks the whole loop in `time.sleep` for
HELD_LOOP_S seconds and writes when it held it ("START END", CLOCK_MONOTONIC,
which every process on the machine shares) to FILE.held. Every systemd
notification the daemon sends is appended to FILE.sent as "T STATE", just
before it goes out. The fault and the record live here, in the test's
launcher; the daemon is mcplhost's own `main`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from mcplhost import host as host_module
from mcplhost.__main__ import main
from mcplhost.systemd import Notifier

#: The variable naming the hold file, and the one giving how long a hold lasts.
HELD_LOOP_FILE, HELD_LOOP_S = "HELD_LOOP_FILE", "HELD_LOOP_S"
#: How often the task looks for the hold file.
POLL_S = 0.01


def held_record(hold: Path) -> Path:
    return hold.with_name(hold.name + ".held")


def sent_record(hold: Path) -> Path:
    return hold.with_name(hold.name + ".sent")


def sent(hold: Path) -> list[tuple[float, str]]:
    """Each notification the daemon sent: (when, state)."""
    path = sent_record(hold)
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [(float(t), state) for t, _, state in (line.partition(" ") for line in lines)]


async def hold_once(hold: Path, seconds: float) -> None:
    while not hold.exists():
        await anyio.sleep(POLL_S)
    start = time.monotonic()
    time.sleep(seconds)  # on the loop's own thread, on purpose: nothing else of the daemon's loop may run
    end = time.monotonic()
    record = held_record(hold)
    record.with_suffix(".tmp").write_text(f"{start} {end}", encoding="utf-8")
    os.replace(record.with_suffix(".tmp"), record)


def install(hold: Path, seconds: float) -> None:
    send, run = Notifier.send, host_module.Host.run

    def recorded_send(self: Notifier, state: str) -> None:
        with sent_record(hold).open("a", encoding="utf-8") as out:
            out.write(f"{time.monotonic()} {state}\n")
        send(self, state)

    async def held_run(self: host_module.Host, stop: anyio.Event, **options: Any) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_once, hold, seconds)
            await run(self, stop, **options)
            tg.cancel_scope.cancel()

    Notifier.send = recorded_send  # type: ignore[method-assign]
    host_module.Host.run = held_run  # type: ignore[method-assign]


if __name__ == "__main__":
    install(Path(os.environ[HELD_LOOP_FILE]), float(os.environ[HELD_LOOP_S]))
    sys.exit(main())
