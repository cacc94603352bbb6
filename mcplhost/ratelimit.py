"""How many lines of one kind may be written: fixed windows per key, time as a parameter.

A key's window opens at the first event after the previous one closed and
lasts `window_s`. The first `allowance` events of a window pass; the rest
are counted, and when the window closes that count comes out once as a
`Suppressed` (from `admit`, when the key's next event opens a new window,
or from `roll`/`drain`, so no later event is needed). So per key and window
at most `allowance` events pass plus one summary, and the summaries add up
exactly to what was held back. No clock and no I/O here: the caller passes
`now` (the driver in `mcplhost.logs` sleeps until `next_deadline()`).

The caller chooses the keys; they must come from a bounded set (event
names the host defines), never from strings a peer sent.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Suppressed:
    """`count` events of `key` were held back in the window that opened at `since`."""

    key: str
    count: int
    since: float


class _Window:
    __slots__ = ("count", "passed", "start")

    def __init__(self, start: float) -> None:
        self.start, self.passed, self.count = start, 0, 0


class WindowLimiter:
    def __init__(self, allowance: int, window_s: float) -> None:
        if allowance < 0 or not window_s > 0:
            raise ValueError("allowance must be >= 0 and window_s > 0")
        self.allowance = allowance
        self.window_s = window_s
        self._windows: dict[str, _Window] = {}

    def admit(self, key: str, now: float) -> tuple[bool, Suppressed | None]:
        """Whether this event of `key` passes, and the summary of the key's previous window if it just closed."""
        window = self._windows.get(key)
        summary = None
        if window is None or now >= window.start + self.window_s:
            summary = _summary(key, window)
            window = self._windows[key] = _Window(now)
        if window.passed < self.allowance:
            window.passed += 1
            return True, summary
        window.count += 1
        return False, summary

    def roll(self, now: float) -> list[Suppressed]:
        """Close every window that has ended by `now`; the summaries of those that held events back."""
        ended = [key for key, window in self._windows.items() if now >= window.start + self.window_s]
        return [s for key in ended if (s := _summary(key, self._windows.pop(key))) is not None]

    def drain(self) -> list[Suppressed]:
        """Close every window now (the source is gone); the summaries of those that held events back."""
        windows, self._windows = self._windows, {}
        return [s for key, window in windows.items() if (s := _summary(key, window)) is not None]

    def next_deadline(self) -> float | None:
        """When the earliest window holding events back closes (None: no summary is due)."""
        due = [w.start + self.window_s for w in self._windows.values() if w.count]
        return min(due, default=None)


def _summary(key: str, window: _Window | None) -> Suppressed | None:
    if window is None or not window.count:
        return None
    return Suppressed(key, window.count, window.start)
