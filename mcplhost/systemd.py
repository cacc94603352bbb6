"""The systemd notify protocol: READY=1, STOPPING=1 and WATCHDOG=1 datagrams.

Active only when NOTIFY_SOCKET is set (a path, or "@name" for the abstract
namespace). Sending never blocks and never raises: a lost notification must
not take the daemon down.

Test-only, the loop-hold seam: with `MCPLHOST_TEST_HOLD_LOOP` naming a file
and the watchdog on, a task on the event loop blocks the whole loop in
`time.sleep` for as long as that file exists, creating `FILE.held` while it
holds, so a test can freeze the loop at a moment it chooses and see the
WATCHDOG=1 pings stop (docs/operations.md#health-checks-and-the-container).
Unset, as in production, no such task exists.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import anyio

#: Test-only: the file whose existence holds the event loop (module docstring).
HOLD_LOOP_ENV = "MCPLHOST_TEST_HOLD_LOOP"
#: Appended to the hold file's name for the marker that exists exactly while the loop is held.
HOLD_LOOP_HELD_SUFFIX = ".held"
#: How often the seam looks for its file, and how often a held loop looks whether it is gone.
HOLD_LOOP_POLL_S = 0.02


class Notifier:
    def __init__(self, address: str | None, log: Any) -> None:
        self.log = log
        self._address: str | bytes | None = None
        self._socket: socket.socket | None = None
        if address:
            self._address = "\0" + address[1:] if address.startswith("@") else address
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._socket.setblocking(False)

    @classmethod
    def from_environment(cls, log: Any) -> Notifier:
        return cls(os.environ.get("NOTIFY_SOCKET"), log)

    def send(self, state: str) -> None:
        if self._socket is None or self._address is None:
            return
        try:
            self._socket.sendto(state.encode(), self._address)
        except OSError as exc:
            self.log.warning("systemd.notify_failed", state=state, error=str(exc))

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def watchdog_interval_s(environ: dict[str, str] | None = None) -> float | None:
    """Half of WATCHDOG_USEC in seconds (systemd's advice), when the watchdog is on for us."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2_000_000 if value > 0 else None


def loop_hold_file(environ: dict[str, str] | None = None) -> Path | None:
    """The test seam's hold file, when `MCPLHOST_TEST_HOLD_LOOP` names one (None: the seam is off)."""
    env = os.environ if environ is None else environ
    value = env.get(HOLD_LOOP_ENV)
    return Path(value) if value else None


async def hold_loop_on_request(hold: Path) -> None:
    """Test-only: whenever `hold` exists, block this event loop until it is removed (module docstring)."""
    while True:
        if hold.exists():
            _block_while_exists(hold)
        await anyio.sleep(HOLD_LOOP_POLL_S)


def _block_while_exists(hold: Path) -> None:
    held = hold.with_name(hold.name + HOLD_LOOP_HELD_SUFFIX)
    held.touch()
    try:
        while hold.exists():
            time.sleep(HOLD_LOOP_POLL_S)  # on the loop's own thread, on purpose: nothing else may run
    finally:
        held.unlink(missing_ok=True)
