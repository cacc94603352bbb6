"""A hostile connector against a real `mcplhost run`: its log stays bounded, and a stuck log sink stalls nothing.

The connector (tests/bench/hostile_connector.py) has an empty grant and
sends stray responses and refused notifications, then pings; the ping's
answer means the host has read every hostile line.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import subprocess
import termios
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

from mcplhost.logs import FLUSH_ON_EXIT_ENV, LINES_PER_WINDOW

from ..cli.support import cli_env, daemon, write_config
from ..harness import PYTHON, REPO, wait_for

HOSTILE = REPO / "tests" / "bench" / "hostile_connector.py"
#: Hostile lines in the test: a tenth of the review's 40,000, so the goal of 1,000 log lines scales to 100.
STRAY = REFUSED = 2000
MAX_LINES = 1000 * (STRAY + REFUSED) // 40_000


def hostile_connector(folder: Path, **env: str) -> dict[str, Any]:
    return {"name": "hostile", "command": [PYTHON, str(HOSTILE)], "cwd": str(REPO), "grant": [],
            "env": {"HOSTILE_STRAY": str(STRAY), "HOSTILE_REFUSED": str(REFUSED),
                    "HOSTILE_RESULT": str(folder / "hostile.result.json"), "PYTHONPATH": str(REPO), **env},
            "restart": {"policy": "never"}, "stop_grace_s": 1, "term_grace_s": 1}


def result(folder: Path) -> dict[str, Any] | None:
    path = folder / "hostile.result.json"
    return json.loads(path.read_text()) if path.exists() else None


class TestLogFlood:
    async def test_forty_thousand_hostile_lines_scaled_leave_a_bounded_log_with_exact_counts(self, tmp_path) -> None:
        """A tenth of the review's flood writes at most a tenth of 1,000 lines; the summaries count the rest."""
        config = write_config(tmp_path, [hostile_connector(tmp_path)])
        async with daemon(config, tmp_path) as run:
            await wait_for(lambda: result(tmp_path), timeout=60)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
            lines = run.lines()
        assert len(lines) <= MAX_LINES, Counter(e["event"] for e in lines).most_common(5)
        assert lines[-1]["event"] == "host.stopped"  # the queue was flushed on exit
        summaries = [e for e in lines if e["event"] == "log.suppressed"]
        assert all(e["connector"] == "hostile" for e in summaries)
        for event, sent in (("rpc.response_dropped", STRAY), ("connector.notification_refused", REFUSED)):
            written = [e for e in lines if e["event"] == event]
            assert len(written) == LINES_PER_WINDOW
            assert sum(e["count"] for e in summaries if e["suppressed_event"] == event) + len(written) == sent

    async def test_a_log_sink_nobody_reads_does_not_stall_the_host(self, tmp_path) -> None:
        """With the daemon's stderr a full pipe, it keeps answering its connector and still stops cleanly.

        Its exit gives up on the stuck sink after the flush bound, set to 0.5 s here (MCPLHOST_LOG_FLUSH_S).
        """
        rounds = 30
        # Each round the connector writes 100 stderr lines of 2,000 characters, which the host logs (50 a
        # second): its own stderr pipe fills within a second, while pings go on for about three.
        connector = hostile_connector(tmp_path, HOSTILE_ROUNDS=str(rounds), HOSTILE_STDERR="100",
                                      HOSTILE_ROUND_S="0.1")
        config = write_config(tmp_path, [connector])
        read_fd, write_fd = os.pipe()  # the daemon's stderr; read only at the end
        try:
            process = await anyio.open_process([PYTHON, "-m", "mcplhost", "run", "--config", str(config)],
                                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                               stderr=write_fd, env=cli_env({FLUSH_ON_EXIT_ENV: "0.5"}), cwd=REPO)
        finally:
            os.close(write_fd)
        try:
            await wait_for(lambda: result(tmp_path), timeout=60)
            assert result(tmp_path)["pings"] == rounds
            assert pending_bytes(read_fd) >= 60_000  # the pipe was full: the sink really blocked
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                assert await process.wait() == 0
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                await process.wait()
                await process.aclose()
            os.close(read_fd)


def pending_bytes(fd: int) -> int:
    """How many bytes wait unread in a pipe."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
