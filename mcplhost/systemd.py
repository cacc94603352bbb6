"""The systemd notify protocol: READY=1, STOPPING=1 and WATCHDOG=1 datagrams.

Active only when NOTIFY_SOCKET is set (a path, or "@name" for the abstract
namespace). Sending never blocks and never raises: a lost notification must
not take the daemon down.
"""

from __future__ import annotations

import os
import socket
from typing import Any


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
