"""structlog configuration, the log writer thread, and the limiter for lines a connector causes.

Only the CLI calls `configure` (and `shutdown` on its way out); modules take
`structlog.get_logger()` at import. `mcplhost dev` passes a `tap` (its live
view sees every event) and may hide the log lines themselves (`show=False`);
the web console adds its own while it runs (`tapping`).

Rendered lines never touch the sink from the event loop: they go into a
bounded queue that one writer thread empties (`LineQueue`), so a sink that
blocks (stderr into a full pipe, a slow journald) stalls only that thread.
When the queue is full a line is dropped and counted, and the next write
carries a `log.dropped` line with the count (docs/operations.md#logs).

Per-message events a connector can cause at will (a refusal, a stray
response, a junk line) go through a `LimitedLog`: per connector and event,
the first `LINES_PER_WINDOW` lines of each `WINDOW_S` window, then one
`log.suppressed` line with the count when the window closes or the
connector's life ends. The exact counts live in the components'
`statistics()`, never only here; `SuppressedTotals` adds up, per host, what
every `LimitedLog` of a connector held back across its process lives, for
the metrics (docs/operations.md#metrics).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any, Literal

import anyio
import msgspec
import structlog

from .ratelimit import Suppressed, WindowLimiter
from .secrets import NO_SECRETS, Secrets
from .tracebacks import cut_middle

LogFormat = Literal["json", "console"]
Tap = Callable[[dict[str, Any]], None]

#: Lines of one event per connector written in each window before the rest are only counted.
LINES_PER_WINDOW = 10
#: The window of `LINES_PER_WINDOW`, in seconds; its suppressed count is logged when it closes.
WINDOW_S = 60.0
#: Rendered lines waiting for the writer thread; past this they are dropped and counted.
QUEUE_LINES = 10_000
#: Lines the writer thread joins into one write.
WRITE_BATCH_LINES = 512
#: On exit, how long the queued lines may take to reach the sink (a stuck sink cannot hold the exit).
FLUSH_ON_EXIT_S = 5.0
#: The environment variable that sets another such bound for one process, in seconds (docs/operations.md,
#: "A slow or stuck log sink"); a test of a stuck sink sets it short instead of waiting the default out.
FLUSH_ON_EXIT_ENV = "MCPLHOST_LOG_FLUSH_S"
#: A logged value (a string, or a list or mapping as JSON) is cut at this many characters: values often
#: carry what a connector sent.
MAX_VALUE_CHARS = 2000

_STOP = object()  # the writer thread's end-of-queue marker


class LineQueue:
    """Rendered log lines, written to `write` by one thread; never blocks the caller.

    `put` drops a line when `max_lines` are waiting (counted in `dropped`;
    the next write adds `dropped_line(count)`). A write that fails (the
    reader of stderr went away) ends writing for good; later lines are
    counted as dropped. After `close`, lines are written by the caller.
    """

    def __init__(self, write: Callable[[bytes], None], dropped_line: Callable[[int], str], *,
                 max_lines: int = QUEUE_LINES) -> None:
        self._write = write
        self._dropped_line = dropped_line
        self._queue: queue.Queue[Any] = queue.Queue(max_lines)
        self._lock = threading.Lock()
        self._unreported = 0
        #: Lines dropped so far, in total (queue full or sink broken).
        self.dropped = 0
        self._broken = False
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="mcplhost-log-writer", daemon=True)
        self._thread.start()

    def put(self, line: str) -> None:
        if self._closed:  # after `close`: written here, unless the thread is still stuck in a write
            if self._thread.is_alive():
                self._count_dropped(1)
            else:
                self._write_now([line])
            return
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self._count_dropped(1)

    def close(self, timeout: float = FLUSH_ON_EXIT_S) -> bool:
        """Write what is queued and end the thread, within `timeout`; whether everything went out."""
        if self._closed:
            return not self._thread.is_alive()
        self._closed = True
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def _count_dropped(self, lines: int) -> None:
        with self._lock:
            self._unreported += lines
            self.dropped += lines

    def _take_unreported(self) -> int:
        with self._lock:
            count, self._unreported = self._unreported, 0
        return count

    def _serve(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < WRITE_BATCH_LINES:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = _STOP in batch
            self._write_now([line for line in batch if line is not _STOP])
            # `close` may have found the queue full and given up queueing its stop: once the queue is empty after
            # a close, nothing more comes (later lines are the caller's), so the thread ends either way.
            if stop or (self._closed and self._queue.empty()):
                return

    def _write_now(self, lines: list[str]) -> None:
        if self._broken:
            self._count_dropped(len(lines))
            return
        dropped = self._take_unreported()
        if dropped:
            lines.append(self._dropped_line(dropped))
        if not lines:
            return
        try:
            self._write(("\n".join(lines) + "\n").encode("utf-8", "replace"))
        except (OSError, ValueError):  # the sink is gone (EPIPE, a closed file): nothing more can be written
            self._broken = True
            self._count_dropped(len(lines) - (1 if dropped else 0))


class StreamSink:
    """Writes bytes to a stream's file descriptor through a duplicate of it, else through the stream.

    A duplicate descriptor keeps the writer thread off `sys.stderr`'s own
    buffer and lock, which the interpreter takes at exit. `release` gives the
    duplicate back once the writer thread has ended (`shutdown`), so a
    process that configures logging many times (the CLI called in-process)
    holds no descriptor per call; later lines go through the stream itself.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        try:
            self._fd: int | None = os.dup(stream.fileno())
        except (AttributeError, OSError, ValueError):
            self._fd = None

    def write(self, data: bytes) -> None:
        fd = self._fd
        if fd is None:
            self._stream.write(data.decode("utf-8", "replace"))
            self._stream.flush()
            return
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class _QueueLogger:
    """structlog's logger: hands each rendered line to the queue (whatever the method name)."""

    def __init__(self, lines: LineQueue) -> None:
        self._lines = lines

    def msg(self, message: str) -> None:
        self._lines.put(message)

    log = debug = info = warn = warning = err = error = critical = exception = fatal = failure = msg


_lines: LineQueue | None = None
_sink: StreamSink | None = None
#: The host's secret values, redacted from every line (`redact_secrets`); none until a host installs its own.
_secrets: Secrets = NO_SECRETS


def redact_secrets(secrets: Secrets) -> None:
    """Redact `secrets`' values from every later log line (the host calls it once it knows them)."""
    global _secrets
    _secrets = secrets


def _redacting(renderer: structlog.typing.Processor) -> structlog.typing.Processor:
    """`renderer`, then the rendered line redacted: covers tracebacks, reprs and whatever a value rendered to.

    `_redact_event` ran before already (values, then the formatted traceback); this is the last net.
    """
    def processor(logger: Any, method: str, event: structlog.typing.EventDict) -> Any:
        secrets = _secrets
        if not secrets:
            return renderer(logger, method, event)
        line = renderer(logger, method, event)
        return secrets.redact(line) if isinstance(line, str) else line

    return processor


def _redact_event(logger: Any, method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """Every string value of the event redacted, before the tap sees it and before values are cut to size."""
    secrets = _secrets
    if not secrets:
        return event
    return {key: secrets.redact(value) if isinstance(value, str) else
            secrets.redact_json(value) if isinstance(value, (dict, list, tuple)) else value
            for key, value in event.items()}


def configure(log_format: LogFormat = "json", level: str = "info", *, tap: Tap | None = None,
              show: bool = True) -> None:
    """Log to stderr through the writer thread (a previous configuration's queue is flushed first)."""
    global _lines, _sink
    renderer: structlog.typing.Processor
    if log_format == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        renderer = structlog.processors.JSONRenderer()
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _redact_event,  # before the tap and before any value is cut (a cut secret's first half is still one)
    ]
    if tap is not None:
        processors.append(_tapping(tap))
    processors.append(_added_taps)
    if not show:
        processors.append(_drop)
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    processors += [_bound_values, stamp, structlog.processors.format_exc_info, _redact_event, _bound_tracebacks,
                   _redacting(renderer)]

    def dropped_line(count: int) -> str:
        event = {"event": "log.dropped", "level": "warning", "lines": count,
                 "detail": "the log sink did not keep up; these lines were not written"}
        return str(renderer(None, "warning", stamp(None, "warning", event)))

    shutdown()
    _sink = StreamSink(sys.stderr)
    _lines = lines = LineQueue(_sink.write, dropped_line)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=lambda *args: _QueueLogger(lines),
        # Not cached: a module's logger taken at import would keep the first configuration's level, tap and
        # queue for good, and `configure` runs again when the CLI is called twice in one process. A log call
        # costs about 2 µs more; connectors' lines are bounded by `LimitedLog` anyway.
        cache_logger_on_first_use=False,
    )


def flush_on_exit_s(environ: Mapping[str, str] = os.environ) -> float:
    """FLUSH_ON_EXIT_S, or FLUSH_ON_EXIT_ENV's value when that is a finite number of seconds, 0 or more."""
    try:
        seconds = float(environ.get(FLUSH_ON_EXIT_ENV, ""))
    except ValueError:
        return FLUSH_ON_EXIT_S
    return seconds if 0 <= seconds < float("inf") else FLUSH_ON_EXIT_S


def shutdown(timeout: float | None = None) -> bool:
    """Write every queued line (within `timeout`, by default `flush_on_exit_s()`) and stop the writer thread;
    later lines are written directly.

    The next `configure` starts afresh: the CLI may run many commands in one process (tests call `cli.main`).
    """
    if _lines is None:
        return True
    done = _lines.close(flush_on_exit_s() if timeout is None else timeout)
    if done and _sink is not None:
        _sink.release()  # the thread has ended: nothing writes through the duplicate any more
    return done


atexit.register(shutdown)  # a safety net: the CLI calls shutdown itself, before its last words


#: Taps added while something runs (`tapping`: the web console's feed), beside `configure`'s own.
_taps: tuple[Tap, ...] = ()


@contextmanager
def tapping(tap: Tap) -> Iterator[None]:
    """`tap` sees every event `configure`'s tap would, redacted, while inside (events below the level never come)."""
    global _taps
    _taps = (*_taps, tap)
    try:
        yield
    finally:
        _taps = tuple(t for t in _taps if t is not tap)


def _added_taps(logger: Any, method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    for tap in _taps:
        tap(dict(event))
    return event


def _tapping(tap: Tap) -> structlog.typing.Processor:
    def processor(logger: Any, method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
        tap(dict(event))
        return event

    return processor


#: Fields holding a traceback: bounded by `_bound_tracebacks` instead, keeping the end, where it was raised.
TRACEBACK_FIELDS = frozenset({"traceback", "exception"})


def _bound_values(logger: Any, method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """Every value cut to a bounded size, so no line carries a connector's megabyte."""
    return {key: value if key in TRACEBACK_FIELDS else bounded(value) for key, value in event.items()}


def _bound_tracebacks(logger: Any, method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """A traceback (`exc_info` as formatted, or one passed as a field) cut in the middle: its message may hold
    what a connector or a model sent."""
    for key in TRACEBACK_FIELDS & event.keys():
        event[key] = cut_middle(event[key]) if isinstance(event[key], str) else bounded(event[key])
    return event


def bounded(value: Any) -> Any:
    """`value`, or when its text is longer than MAX_VALUE_CHARS, that text cut there and marked "…".

    A container is measured as the JSON it renders to, so its whole size is
    bounded however deep it nests.
    """
    if isinstance(value, str):
        return value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + "…"
    if isinstance(value, (bytes, bytearray)):
        return bounded(bytes(value[:MAX_VALUE_CHARS + 1]).decode("utf-8", "replace"))
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        text = _as_text(value)
        return value if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "…"
    return value


def _as_text(value: Any) -> str:
    try:
        return msgspec.json.encode(value, enc_hook=repr).decode("utf-8", "replace")
    except (TypeError, ValueError):  # e.g. keys that are not strings
        return repr(value)


def _drop(logger: Any, method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    raise structlog.DropEvent


# --- lines a connector causes ------------------------------------------------------

_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class SuppressedTotals:
    """Lines suppressed per (connector, event or key) since the host started, across the connector's lives.

    One per host: each `LimitedLog` of a connector adds to it through its
    `tally` (`tally_for(name)`); the metrics read `snapshot()`. Keys are the
    host's own event names, so its size is bounded by connectors × events.
    """

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}

    def add(self, connector: str, event: str) -> None:
        key = (connector, event)
        self._counts[key] = self._counts.get(key, 0) + 1

    def tally_for(self, connector: str) -> Callable[[str], None]:
        """What a `LimitedLog` of `connector` calls with each line it suppresses."""
        return lambda event: self.add(connector, event)

    def snapshot(self) -> dict[tuple[str, str], int]:
        return dict(self._counts)


class LimitedLog:
    """A connector's per-message events: the first lines of each event per window, then a count.

    `info/warning/error(event, **fields)` write through `log` (bound to the
    connector) while the event's allowance lasts; the rest are counted and
    come out as one `log.suppressed` line (suppressed_event, count,
    window_s) when the window closes (`run`, the driver, sleeps until then)
    or at `close()` (the end of the connector's life). `key` groups lines
    under another name than the event; it must be one of the host's own
    names, never a string the connector chose. Lines filtered out by the
    log level are not counted. Debug lines are not limited. `tally`, when
    given, is called with the key of each suppressed line (a host's
    `SuppressedTotals.tally_for(connector)`).
    """

    def __init__(self, log: Any, *, allowance: int = LINES_PER_WINDOW, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, tally: Callable[[str], None] | None = None) -> None:
        self._log = log
        self._tally = tally
        # structlog's filtering loggers say which levels they write; any other logger writes them all.
        self._enabled: Callable[[int], bool] = getattr(log, "is_enabled_for", lambda level: True)
        self._limiter = WindowLimiter(allowance, window_s)
        self._clock = clock
        self._due: anyio.Event | None = None  # set when a window starts holding lines back (made in `run`)
        self._holding: set[str] = set()  # keys whose current window holds lines back
        self._suppressed: dict[str, int] = {}

    def debug(self, event: str, **fields: Any) -> None:
        self._log.debug(event, **fields)

    def info(self, event: str, *, key: str | None = None, **fields: Any) -> None:
        self._emit("info", event, key, fields)

    def warning(self, event: str, *, key: str | None = None, **fields: Any) -> None:
        self._emit("warning", event, key, fields)

    def error(self, event: str, *, key: str | None = None, **fields: Any) -> None:
        self._emit("error", event, key, fields)

    def _emit(self, level: str, event: str, key: str | None, fields: dict[str, Any]) -> None:
        if not self._enabled(_LEVELS[level]):
            return
        key = key or event
        passed, summary = self._limiter.admit(key, self._clock())
        if summary is not None:
            self._summarize([summary])
        if passed:
            getattr(self._log, level)(event, **fields)
            return
        self._suppressed[key] = self._suppressed.get(key, 0) + 1
        if self._tally is not None:
            self._tally(key)
        if key not in self._holding:  # a new deadline, maybe earlier than the one `run` sleeps to
            self._holding.add(key)
            if self._due is not None:
                self._due.set()

    def statistics(self) -> dict[str, int]:
        """Lines suppressed so far, per event (or key): for the metrics, since the lines are not there."""
        return dict(self._suppressed)

    async def run(self) -> None:
        """Log each window's suppressed count when it closes, without waiting for another line; until cancelled."""
        while True:
            self._due = anyio.Event()
            deadline = self._limiter.next_deadline()
            if deadline is None:
                await self._due.wait()
                continue
            with anyio.move_on_after(max(0.0, deadline - self._clock())):
                await self._due.wait()
            self._summarize(self._limiter.roll(self._clock()))

    def close(self) -> None:
        """The connector's life is over: log what every open window held back."""
        self._summarize(self._limiter.drain())

    def _summarize(self, summaries: list[Suppressed]) -> None:
        for summary in summaries:
            self._holding.discard(summary.key)
            window_s = self._limiter.window_s
            self._log.warning("log.suppressed", suppressed_event=summary.key, count=summary.count, window_s=window_s,
                              detail=f"{summary.count} more {summary.key} lines in a {window_s:g} s window"
                                     " were counted, not written")
