"""The log boundary: the window arithmetic (mcplhost/ratelimit.py), LimitedLog, the writer thread, bounded values."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections import defaultdict
from typing import Any

import anyio
import pytest
import structlog
from hypothesis import example, given, settings
from hypothesis import strategies as st
from structlog.testing import LogCapture, capture_logs

from mcplhost.logs import (
    FLUSH_ON_EXIT_ENV,
    FLUSH_ON_EXIT_S,
    LINES_PER_WINDOW,
    MAX_VALUE_CHARS,
    LimitedLog,
    LineQueue,
    SuppressedTotals,
    bounded,
    flush_on_exit_s,
)
from mcplhost.ratelimit import Suppressed, WindowLimiter
from mcplhost.tracebacks import TRACEBACK_MAX_CHARS

from .harness import REPO, logged, wait_for
from .properties import examples

KEYS = ("a", "b", "c")
#: One step of a run: an event of a key after `dt` seconds, or a roll-over check after `dt` seconds.
steps = st.lists(st.tuples(st.sampled_from((*KEYS, "roll")), st.floats(0, 3, allow_nan=False)), max_size=200)


def window_starts(times: list[float], window_s: float) -> list[float]:
    """The spec, independent of the limiter: a window opens at the first event at or past the previous one's end."""
    starts: list[float] = []
    for t in times:
        if not starts or t >= starts[-1] + window_s:
            starts.append(t)
    return starts


class TestWindowLimiter:
    @settings(max_examples=examples(60), deadline=None)
    @given(steps=steps, allowance=st.integers(0, 5), window_s=st.sampled_from((0.5, 1.0, 2.5)))
    @example(steps=[("a", 0.0)] * 7 + [("a", 1.0)], allowance=3, window_s=1.0)
    def test_each_window_passes_its_allowance_and_one_exact_summary(self, steps, allowance, window_s) -> None:
        """Per key and window: at most `allowance` events pass, plus one summary whose count is exactly the rest."""
        limiter = WindowLimiter(allowance, window_s)
        now = 0.0
        times: dict[str, list[float]] = defaultdict(list)
        passed: dict[str, list[float]] = defaultdict(list)
        summaries: list[tuple[Suppressed, float]] = []  # with the time each came out
        for what, dt in steps:
            now += dt
            if what == "roll":
                summaries += [(s, now) for s in limiter.roll(now)]
            else:
                times[what].append(now)
                ok, summary = limiter.admit(what, now)
                if ok:
                    passed[what].append(now)
                if summary is not None:
                    summaries.append((summary, now))
            deadline = limiter.next_deadline()
            if deadline is not None and deadline <= now and what == "roll":
                raise AssertionError("a roll at or past the deadline leaves it due")
        ends = [(s, None) for s in limiter.drain()]
        assert limiter.drain() == [] and limiter.next_deadline() is None
        for key in KEYS:
            starts = window_starts(times[key], window_s)
            mine = [(s, at) for s, at in summaries + ends if s.key == key]
            assert len({s.since for s, _ in mine}) == len(mine)  # one summary per window at most
            by_window = {s.since: s.count for s, _ in mine}
            assert set(by_window) <= set(starts)
            for start in starts:
                events = sum(1 for t in times[key] if start <= t < start + window_s)
                lines = sum(1 for t in passed[key] if start <= t < start + window_s)
                assert lines == min(events, allowance)
                assert by_window.get(start, 0) == events - lines
                assert lines + (start in by_window) <= allowance + 1
            for s, at in mine:
                assert at is None or at >= s.since + window_s  # said when the window closed, not before
            assert sum(by_window.values()) == len(times[key]) - len(passed[key])

    def test_a_roll_at_the_deadline_gives_the_summary(self) -> None:
        """next_deadline is when the window holding events back closes; roll then gives its count."""
        limiter = WindowLimiter(1, 10.0)
        for t in (0.0, 1.0, 2.0):
            limiter.admit("k", t)
        assert limiter.next_deadline() == 10.0
        assert limiter.roll(9.999) == []
        assert limiter.roll(10.0) == [Suppressed("k", 2, 0.0)]
        assert limiter.next_deadline() is None

    def test_nonsense_bounds_are_refused(self) -> None:
        """A negative allowance or an empty window is a programming error, said at once."""
        with pytest.raises(ValueError):
            WindowLimiter(-1, 1.0)
        with pytest.raises(ValueError):
            WindowLimiter(1, 0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TestLimitedLog:
    def test_the_first_lines_pass_then_one_summary_at_close_with_exact_counts(self) -> None:
        """Past the allowance nothing is written until close(), which says how many were held back."""
        clock = Clock()
        with capture_logs() as logs:
            limited = LimitedLog(structlog.get_logger().bind(connector="x"), clock=clock)
            for n in range(1000):
                limited.warning("rpc.response_dropped", id=n)
            limited.info("mcpl.refused", method="m")
            assert limited.statistics() == {"rpc.response_dropped": 1000 - LINES_PER_WINDOW}
            limited.close()
        assert [e["id"] for e in logged(logs, "rpc.response_dropped")] == list(range(LINES_PER_WINDOW))
        assert len(logged(logs, "mcpl.refused")) == 1  # another event has its own allowance
        (summary,) = logged(logs, "log.suppressed")
        assert summary["connector"] == "x" and summary["suppressed_event"] == "rpc.response_dropped"
        assert summary["count"] == 1000 - LINES_PER_WINDOW and summary["log_level"] == "warning"

    def test_the_next_window_gives_the_summary_and_a_fresh_allowance(self) -> None:
        """An event in a new window first says what the old one held back, then passes again."""
        clock = Clock()
        with capture_logs() as logs:
            limited = LimitedLog(structlog.get_logger(), allowance=2, window_s=60, clock=clock)
            for _ in range(5):
                limited.info("e")
            clock.now += 60
            limited.info("e")
        assert [e["event"] for e in logs] == ["e", "e", "log.suppressed", "e"]
        assert logs[2]["count"] == 3

    def test_a_key_groups_events_under_one_allowance(self) -> None:
        """Events logged with the same key share one allowance and one count."""
        with capture_logs() as logs:
            limited = LimitedLog(structlog.get_logger(), allowance=1, clock=Clock())
            limited.warning("one", key="group")
            limited.warning("two", key="group")
            limited.close()
        assert [e["event"] for e in logs] == ["one", "log.suppressed"] and logs[1]["suppressed_event"] == "group"

    def test_lines_below_the_log_level_are_neither_written_nor_counted(self) -> None:
        """An info event under --log-level warning uses no allowance and yields no summary."""
        capture = LogCapture()
        log = structlog.wrap_logger(None, processors=[capture],
                                    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        limited = LimitedLog(log, allowance=1, clock=Clock())
        for _ in range(5):
            limited.info("quiet")
            limited.debug("debugged")
        limited.warning("loud")
        limited.close()
        assert [e["event"] for e in capture.entries] == ["loud"] and limited.statistics() == {}

    async def test_run_says_the_count_when_the_window_closes_without_another_line(self) -> None:
        """The driver wakes at the window's end: the summary needs no later line to appear."""
        with capture_logs() as logs:
            limited = LimitedLog(structlog.get_logger(), allowance=1, window_s=0.2)
            async with anyio.create_task_group() as tg:
                tg.start_soon(limited.run)
                await anyio.sleep(0)  # run is waiting, with nothing due
                for _ in range(4):
                    limited.warning("flood")
                await wait_for(lambda: logged(logs, "log.suppressed"), timeout=5, interval=0.01)
                tg.cancel_scope.cancel()
        (summary,) = logged(logs, "log.suppressed")
        assert summary["count"] == 3 and len(logged(logs, "flood")) == 1


    async def test_a_later_window_that_closes_first_is_summed_up_first(self) -> None:
        """run wakes for each new deadline: a window opened earlier but held back later is not kept waiting."""
        with capture_logs() as logs:
            limited = LimitedLog(structlog.get_logger(), allowance=1, window_s=0.6)
            async with anyio.create_task_group() as tg:
                tg.start_soon(limited.run)
                limited.info("early")  # its window opens now and closes first
                await anyio.sleep(0.3)  # the scenario's timing, not a wait for a condition
                limited.info("late")
                limited.info("late")  # held back: run sleeps until the late window closes...
                limited.info("early")  # ...unless this earlier deadline wakes it
                await wait_for(lambda: logged(logs, "log.suppressed", suppressed_event="early"), timeout=5,
                               interval=0.005)
                assert not logged(logs, "log.suppressed", suppressed_event="late")
                await wait_for(lambda: logged(logs, "log.suppressed", suppressed_event="late"), timeout=5,
                               interval=0.005)
                tg.cancel_scope.cancel()


def fill_pipe(fd: int) -> None:
    """Write whole `prefill` lines to a pipe nobody reads until it is full (each write is below PIPE_BUF: atomic)."""
    os.set_blocking(fd, False)
    line = (json.dumps({"event": "prefill"}) + "\n").encode()
    try:
        while True:
            os.write(fd, line)
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(fd, True)


def pipe_writer(fd: int) -> Any:
    """What fd_writer gives for a real stream, on a descriptor the test owns (and closes)."""
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    return write


class TestLineQueue:
    async def test_a_close_that_found_the_queue_full_still_ends_the_writer_once_the_sink_drains(self) -> None:
        """A close while the sink is stuck and the queue full cannot queue its stop; the writer thread still ends
        when the sink takes its lines again (it waited for a line that never came: a thread left per such close,
        as the in-process CLI saw)."""
        entered, unstuck = threading.Event(), threading.Event()
        written: list[bytes] = []

        def stuck_sink(data: bytes) -> None:
            entered.set()
            unstuck.wait(30)
            written.append(data)

        lines = LineQueue(stuck_sink, lambda n: json.dumps({"event": "log.dropped", "lines": n}), max_lines=10)
        lines.put("first")
        await wait_for(entered.is_set)  # the thread holds "first" inside the write: the queue is empty
        for n in range(20):
            lines.put(f"line {n}")  # 10 queued behind the stuck write, 10 dropped
        assert lines.dropped == 10
        assert not lines.close(timeout=0.05)  # no room for the stop
        unstuck.set()
        await wait_for(lambda: lines.close(timeout=0), timeout=10)
        text = b"".join(written).decode()
        assert text.count("line ") == 10 and '"lines": 10' in text

    async def test_a_sink_nobody_reads_does_not_stall_the_loop(self) -> None:
        """With stderr a full pipe, logging stays instant: another task keeps ticking; the excess is counted."""
        read_fd, write_fd = os.pipe()
        lines = LineQueue(pipe_writer(write_fd), lambda n: json.dumps({"event": "log.dropped", "lines": n}),
                          max_lines=100)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await anyio.sleep(0)

        received = bytearray()

        def drain() -> None:
            while chunk := os.read(read_fd, 65536):
                received.extend(chunk)

        reader = threading.Thread(target=drain, daemon=True)
        fill_pipe(write_fd)  # full before the first line: the writer thread is stuck however the threads run
        try:
            line = json.dumps({"event": "filler", "pad": "x" * 500})
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                # Far more than the pipe (64 KiB) and the queue hold: a synchronous sink would block here for good.
                for n in range(5000):
                    lines.put(line)
                    if n % 100 == 0:
                        await anyio.sleep(0)
                await wait_for(lambda: ticks >= 50, timeout=10, interval=0.001)
                tg.cancel_scope.cancel()
            assert lines.dropped > 0
            assert not lines.close(timeout=0.2)  # a stuck sink cannot hold the exit
            lines.put(line)  # after close, while the thread is stuck: dropped, never blocking
            # The reader comes back: what was queued arrives, then the count of what was not.
            reader.start()
            await wait_for(lambda: b"log.dropped" in received and received.endswith(b"\n"), timeout=10)
        finally:
            os.close(write_fd)
        reader.join(5)
        os.close(read_fd)
        parsed = [json.loads(text) for text in received.decode().splitlines()]
        reported = sum(e["lines"] for e in parsed if e["event"] == "log.dropped")
        fillers = sum(1 for e in parsed if e["event"] == "filler")
        assert reported == lines.dropped and fillers + reported == 5001

    def test_close_writes_everything_queued(self) -> None:
        """On a normal exit the last lines are not lost."""
        read_fd, write_fd = os.pipe()
        lines = LineQueue(pipe_writer(write_fd), str)
        for n in range(100):
            lines.put(f"line {n}")
        assert lines.close()
        lines.put("after close")  # written directly once the thread is done
        os.close(write_fd)
        with os.fdopen(read_fd) as reader:
            assert reader.read().splitlines() == [f"line {n}" for n in range(100)] + ["after close"]

    def test_a_sink_that_went_away_counts_lines_instead_of_raising(self) -> None:
        """EPIPE on stderr never reaches the code that logs."""
        read_fd, write_fd = os.pipe()
        os.close(read_fd)
        lines = LineQueue(pipe_writer(write_fd), str)
        for _ in range(10):
            lines.put("nobody hears this")
        assert lines.close()
        assert lines.dropped == 10
        os.close(write_fd)


class TestFlushOnExit:
    @pytest.mark.parametrize(("value", "seconds"), [
        (None, FLUSH_ON_EXIT_S), ("0.5", 0.5), ("0", 0.0), ("12", 12.0),
        ("", FLUSH_ON_EXIT_S), ("soon", FLUSH_ON_EXIT_S), ("-1", FLUSH_ON_EXIT_S), ("inf", FLUSH_ON_EXIT_S),
        ("nan", FLUSH_ON_EXIT_S),
    ])
    def test_the_environment_sets_the_bound_only_to_a_finite_non_negative_number(self, value, seconds) -> None:
        """MCPLHOST_LOG_FLUSH_S replaces the exit's flush bound; anything else leaves the default."""
        environ = {} if value is None else {FLUSH_ON_EXIT_ENV: value}
        assert flush_on_exit_s(environ) == seconds


class TestBounded:
    # Values on both sides of MAX_VALUE_CHARS: a leaf may be a long text (a short piece repeated, a few draws),
    # so a small tree renders past the bound as often as a wide one did. Hundreds of leaves, each text drawn a
    # character at a time, made generating the input nearly all of this test's time.
    @given(st.recursive(st.text() | st.integers() | st.none()
                        | st.builds(str.__mul__, st.text(min_size=1, max_size=8), st.integers(1, 600)),
                        lambda inner: st.lists(inner, max_size=40) | st.dictionaries(st.text(), inner, max_size=40),
                        max_leaves=40))
    @example(["x" * 100] * 100)
    @example({"k": {"k": {"k": "y" * 3000}}})
    def test_no_value_outgrows_its_bound(self, value) -> None:
        """A value that renders within the bound is kept as it is; any other becomes its text, cut and marked."""
        result = bounded(value)
        rendered = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        if isinstance(value, str):
            assert result == (value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + "…")
        elif len(rendered) <= MAX_VALUE_CHARS:
            assert result == value
        else:
            assert isinstance(result, str) and len(result) == MAX_VALUE_CHARS + 1 and result.endswith("…")

    def test_a_short_value_is_left_alone_and_a_long_one_is_marked(self) -> None:
        """What fits is unchanged; what is cut says so; a member JSON has no form for is measured by its repr."""
        assert bounded({"method": "ping", "n": [1, 2]}) == {"method": "ping", "n": [1, 2]}
        assert bounded("x" * (MAX_VALUE_CHARS + 5)) == "x" * MAX_VALUE_CHARS + "…"
        cut = bounded([object()] * 500)
        assert cut.startswith('["<object object at') and len(cut) == MAX_VALUE_CHARS + 1

    def test_every_field_of_a_configured_line_is_bounded(self, configured_lines) -> None:
        """Through the configured pipeline, each value of the event is bounded before rendering."""
        event = configured_lines["connector.initialized"]
        assert len(event["server"]) == MAX_VALUE_CHARS + 1 and event["server"].endswith("…")


#: Lines written by a real process through `logs.configure("json")`, one per event name.
CONFIGURED_SCRIPT = """
import structlog
from mcplhost import logs
logs.configure("json")
log = structlog.get_logger()
try:
    raise ValueError("x" * 100_000 + " THE END")
except ValueError:
    log.error("crashed", exc_info=True)
log.error("field", traceback="t" * 15_000 + " RAISED HERE")
log.info("connector.initialized", server={"name": "n" * 9000})
logs.shutdown()
"""


@pytest.fixture(scope="module")
def configured_lines() -> dict[str, dict[str, Any]]:
    """CONFIGURED_SCRIPT's stderr, run once for the tests that read it: each JSON line by its event."""
    done = subprocess.run([sys.executable, "-c", CONFIGURED_SCRIPT], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    return {line["event"]: line for line in lines}


class TestTracebacksInTheLog:
    def test_a_huge_exception_message_is_cut_in_the_middle_and_a_bounded_traceback_field_is_whole(
            self, configured_lines) -> None:
        """Through the configured pipeline (a real process's stderr): `exc_info` with a hostile 100,000-character
        message is cut to about TRACEBACK_MAX_CHARS, keeping where it was raised; a `traceback` field already
        within that bound is not cut to MAX_VALUE_CHARS, which would lose its end."""
        crashed, field = configured_lines["crashed"], configured_lines["field"]
        assert len(crashed["exception"]) <= TRACEBACK_MAX_CHARS + 100 and "characters cut" in crashed["exception"]
        assert crashed["exception"].startswith("Traceback") and crashed["exception"].rstrip().endswith("THE END")
        assert field["traceback"] == "t" * 15_000 + " RAISED HERE"


class TestSuppressedTotals:
    def test_every_life_of_a_connector_adds_to_the_hosts_totals(self) -> None:
        """Two LimitedLogs of one connector (two process lives) and one of another: totals per (connector, event)."""
        totals = SuppressedTotals()
        lives = [LimitedLog(_Quiet(), allowance=1, tally=totals.tally_for("disc")) for _ in range(2)]
        other = LimitedLog(_Quiet(), allowance=1, tally=totals.tally_for("zulip"))
        for limited, lines in ((lives[0], 4), (lives[1], 3), (other, 2)):
            for _ in range(lines):
                limited.info("mcpl.refused")
        assert totals.snapshot() == {("disc", "mcpl.refused"): 3 + 2, ("zulip", "mcpl.refused"): 1}
        assert lives[1].statistics() == {"mcpl.refused": 2}  # each life still counts its own


class _Quiet:
    """A logger that writes nowhere."""

    def info(self, event: str, **fields: object) -> None:
        pass

    warning = info
