"""SIGTERM under a flood: every committed message was answered, and every accepted answer was committed.

Each cycle starts a real `mcplhost run` on the same database with a flood
connector (tests/bench/flood_connector.py) that records every answer it reads
in a file of its own (replaced atomically, so it is never read half-written), stops the daemon with SIGTERM mid-flood, and waits for exit 0.
An answer can only arrive over the connector's stdin, so an answer on record
was delivered before stdin closed.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

from ..cli.support import daemon, write_config
from ..harness import PYTHON, REPO, wait_for
from ..properties import DEEP

FLOOD = REPO / "tests" / "bench" / "flood_connector.py"
#: Stop cycles per test: the lost answer showed in about one stop in three.
CYCLES = 10
#: Messages per cycle: more than the host stores before the SIGTERM arrives.
MESSAGES = 20000
#: Small batches and many requests in flight: many deferred commits open at the stop.
BATCH = 5
INFLIGHT = 64
#: Answers read before the SIGTERM: the flood is on and the workers are busy.
ANSWERS_BEFORE_STOP = 30
#: The cycles' time budget: on a busy machine fewer cycles run, never fewer than MIN_CYCLES. The rule it checks
#: is tested in process without chance (tests/rpc/test_session.py::TestStopping); this end-to-end test looks for
#: the race through real processes, all CYCLES of it in a deep run (tests/properties.py).
BUDGET_S = float("inf") if DEEP else 12.0
MIN_CYCLES = 3


def flood_connector(name: str, folder: Path) -> dict[str, Any]:
    return {"name": name, "command": [PYTHON, str(FLOOD)], "cwd": str(REPO),
            "env": {"FLOOD_COUNT": str(MESSAGES), "FLOOD_BATCH": str(BATCH), "FLOOD_INFLIGHT": str(INFLIGHT),
                    "FLOOD_NAME": name, "FLOOD_RESULT": str(folder / f"{name}.result.json"),
                    "FLOOD_ANSWERS": str(folder / f"{name}.answers.json"), "PYTHONPATH": str(REPO)},
            "grant": ["channels.register", "channels.incoming"], "restart": {"policy": "never"},
            "request_timeout_s": 30, "stop_grace_s": 5, "term_grace_s": 1}


def answers(folder: Path) -> list[dict[str, Any]]:
    """Every answer the cycles' connectors recorded so far (each file is whole: it is replaced, never appended)."""
    return [answer for path in sorted(folder.glob("*.answers.json")) for answer in json.loads(path.read_text())]


def committed_message_ids(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("SELECT message_id FROM items")]


class TestStopUnderLoad:
    async def test_every_committed_message_is_answered_across_repeated_sigterms(self, tmp_path) -> None:
        """Repeated SIGTERMs mid-flood leave no committed message unanswered and no accepted answer uncommitted."""
        began = time.monotonic()
        for cycle in range(CYCLES):
            if cycle >= MIN_CYCLES and time.monotonic() - began > BUDGET_S:
                break
            config = write_config(tmp_path, [flood_connector(f"c{cycle}", tmp_path)])
            enough = len(answers(tmp_path)) + ANSWERS_BEFORE_STOP
            async with daemon(config, tmp_path) as run:
                await wait_for(lambda enough=enough: len(answers(tmp_path)) >= enough, timeout=20)
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0, run.stderr()[-2000:]
                assert not run.events("rpc.answer_abandoned")
        answered = [m for answer in answers(tmp_path) for m in answer["accepted"]]
        committed = committed_message_ids(tmp_path / "host.db")
        assert len(committed) == len(set(committed)), "a message was stored twice"
        assert len(answered) == len(set(answered)), "a message was answered twice"
        unanswered = set(committed) - set(answered)
        uncommitted = set(answered) - set(committed)
        assert not unanswered, f"{len(unanswered)} committed messages never answered, e.g. {sorted(unanswered)[:5]}"
        assert not uncommitted, f"{len(uncommitted)} accepted answers not committed, e.g. {sorted(uncommitted)[:5]}"
