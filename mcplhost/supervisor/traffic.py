"""When a connector's items last came in and its publishes last went out (status, metrics and the quiet rule).

`StampingIntake` is the intake each life's connection is given: it stamps
`Traffic.inbound()` for every admitted message or push, then passes it on;
the outbox sender's word (`published()`) stamps the last delivered publish.
Times are kept twice: epoch ms for what status shows, monotonic seconds for
the quiet rule, so a wall-clock step neither starts nor ends a quiet spell.
`wait_activity()` is what the life's quiet watcher (watch.py) waits on: the
next inbound item or (through `stir()`) the next state change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from mcplhost.protocol.intake import AdmittedMessage, AdmittedPush, Intake, PushStored


class Traffic:
    """One connector's last inbound and publish times, for the host's whole run."""

    def __init__(self, *, clock_ms: Callable[[], int], monotonic: Callable[[], float]) -> None:
        self._clock_ms = clock_ms
        self._monotonic = monotonic
        self._last_inbound_at: int | None = None  # epoch ms
        self._last_inbound_mono: float | None = None  # its monotonic twin, for the quiet rule
        self._last_publish_at: int | None = None  # epoch ms
        self._activity: anyio.Event | None = None  # while the quiet watcher waits: set by an inbound item or a change

    @property
    def last_inbound_at(self) -> int | None:
        """Epoch ms of the last admitted channels/incoming message or push/event."""
        return self._last_inbound_at

    @property
    def last_inbound_mono(self) -> float | None:
        """Monotonic seconds of the last admitted item."""
        return self._last_inbound_mono

    @property
    def last_publish_at(self) -> int | None:
        """Epoch ms of the last delivered channels/publish."""
        return self._last_publish_at

    def inbound(self) -> None:
        """An item was admitted now."""
        self._last_inbound_at = self._clock_ms()
        self._last_inbound_mono = self._monotonic()
        self.stir()

    def published(self) -> None:
        """A channels/publish was delivered now."""
        self._last_publish_at = self._clock_ms()

    def stir(self) -> None:
        """Wake the quiet watcher, if it waits (an inbound item, or a state change)."""
        activity, self._activity = self._activity, None
        if activity is not None:
            activity.set()

    async def wait_activity(self) -> None:
        """Wait for the next inbound item or state change."""
        if self._activity is None:
            self._activity = anyio.Event()
        await self._activity.wait()

    def carry_over(self, previous: Traffic) -> None:
        """Continue `previous`'s times (a reload's new handle, before its first life)."""
        self._last_inbound_at, self._last_inbound_mono = previous._last_inbound_at, previous._last_inbound_mono
        self._last_publish_at = previous._last_publish_at


class StampingIntake:
    """An Intake that notes the time of each admitted item before passing it on."""

    def __init__(self, intake: Intake, stamp: Callable[[], None]) -> None:
        self._intake = intake
        self._stamp = stamp

    async def store_messages(self, server_id: str, lane: str, messages: list[AdmittedMessage]
                             ) -> list[dict[str, Any]]:
        if messages:
            self._stamp()
        return await self._intake.store_messages(server_id, lane, messages)

    async def store_push(self, server_id: str, push: AdmittedPush) -> PushStored:
        self._stamp()
        return await self._intake.store_push(server_id, push)

    def content_problem(self, blocks: list[dict[str, Any]]) -> str | None:
        return self._intake.content_problem(blocks)
