"""systemd's STATUS= line: the connectors counted by state (docs/operations.md#systemd-ready-stopping-watchdog)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import anyio

from mcplhost.supervisor.handle import ConnectorHandle
from mcplhost.systemd import Notifier

from .status import STANDBY, systemd_status

#: At most one STATUS= line per this many seconds: a crash loop or a mass restart is not a datagram per change.
STATUS_INTERVAL_S = 1.0


class StatusLine:
    """Sends STATUS= after connector state changes, rate-limited, and only when the text changed."""

    def __init__(self) -> None:
        self._changed = anyio.Event()

    def changed(self) -> None:
        """A connector changed state (each handle's `on_change`), or went on standby."""
        self._changed.set()

    async def run(self, notifier: Notifier, connectors: Mapping[str, ConnectorHandle],
                  is_standby: Callable[[str], bool] | None = None) -> None:
        """`is_standby`: whether another live host runs a connector (a shared store; it is counted as standby)."""
        sent: str | None = None
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            text = systemd_status(STANDBY if is_standby is not None and is_standby(name) else handle.state
                                  for name, handle in connectors.items())
            if text != sent:
                notifier.send(f"STATUS={text}")
                sent = text
            await anyio.sleep(STATUS_INTERVAL_S)
