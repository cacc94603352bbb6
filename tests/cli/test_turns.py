"""`mcplhost turns` (in-process; a closed pipe as a subprocess): the export shape, the plain line, --agent, --limit, and its errors."""

from __future__ import annotations

import json
import re
import shlex
import sqlite3
import subprocess
from pathlib import Path

import anyio

from mcplhost.peers.envelope import envelope, parse_envelope
from mcplhost.store import NewItem, open_store
from mcplhost.store.operations import BeginTurn, InsertItems, RecordTurn
from mcplhost.store.writer import GroupWriter

from ..harness import PYTHON, REPO
from .support import cli, cli_env

EXPORT_KEYS = ["id", "agent", "wakeItemIds", "startedAt", "endedAt", "outcome", "reason", "model", "usage", "requestDigest"]
DIGEST = "0f" * 32
STARTED = 1_790_000_000_000  # 2026-09-21T14:13:20Z


async def seed(db: Path, count: int = 6) -> None:
    """`count` finished turns alternating scout and helper, then one scout turn still running."""
    async with open_store(db) as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        await writer.submit(*(  # one commit: thousands of turns one commit each take seconds
            RecordTurn("scout" if n % 2 == 0 else "helper", (n + 1, n + 2), STARTED + 1000 * n,
                       STARTED + 1000 * n + 1500, "completed", "gpt-4o-mini",
                       {"input_tokens": 100 + n, "output_tokens": 20}, DIGEST)
            for n in range(count)))
        running = await writer.write(BeginTurn("scout", (99,), STARTED + 1000 * count))
        assert running == count + 1
        tg.cancel_scope.cancel()


def exported(db: Path, *args: str) -> list[dict]:
    result = cli("turns", "--db", str(db), "--json", *args)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


class TestTurnsExport:
    async def test_each_turn_is_one_object_with_the_documented_keys(self, tmp_path: Path) -> None:
        """--json prints one object per turn, oldest first, with README.md#commands's keys in order and nulls kept."""
        await seed(tmp_path / "host.db")
        turns = exported(tmp_path / "host.db")
        assert [t["id"] for t in turns] == list(range(1, 8)) and all(list(t) == EXPORT_KEYS for t in turns)
        assert turns[0] == {"id": 1, "agent": "scout", "wakeItemIds": [1, 2], "startedAt": STARTED,
                            "endedAt": STARTED + 1500, "outcome": "completed", "reason": None, "model": "gpt-4o-mini",
                            "usage": {"inputTokens": 100, "outputTokens": 20}, "requestDigest": DIGEST}
        assert turns[-1] == {"id": 7, "agent": "scout", "wakeItemIds": [99], "startedAt": STARTED + 6000,
                             "endedAt": None, "outcome": None, "reason": None, "model": None, "usage": None, "requestDigest": None}

    async def test_agent_and_limit_select_like_messages(self, tmp_path: Path) -> None:
        """--agent keeps one agent's turns; --limit N is the newest N, still oldest first."""
        await seed(tmp_path / "host.db")
        assert [t["id"] for t in exported(tmp_path / "host.db", "--agent", "helper")] == [2, 4, 6]
        assert [t["id"] for t in exported(tmp_path / "host.db", "--limit", "2")] == [6, 7]
        assert [t["id"] for t in exported(tmp_path / "host.db", "--agent", "scout", "--limit", "2")] == [5, 7]
        assert exported(tmp_path / "host.db", "--agent", "nobody") == []
        assert exported(tmp_path / "host.db", "--limit", "0") == []

    async def test_the_plain_view_is_one_line_per_turn(self, tmp_path: Path) -> None:
        """Without --json: id, agent, outcome (running while open), UTC start, seconds, model, tokens, wake ids."""
        await seed(tmp_path / "host.db")
        result = cli("turns", "--db", str(tmp_path / "host.db"))
        assert result.returncode == 0 and result.stderr == ""
        lines = result.stdout.splitlines()
        assert len(lines) == 7
        assert re.fullmatch(r"\s+1  scout\s+completed 2026-09-21T14:13:20Z\s+1\.50s  gpt-4o-mini  tokens=120"
                            r"  wake=1,2", lines[0]), lines[0]
        assert re.fullmatch(r"\s+7  scout\s+running\s+2026-09-21T14:13:26Z\s+-  -  tokens=-  wake=99", lines[-1]), \
            lines[-1]

    async def test_a_long_wake_is_shortened_in_the_plain_view(self, tmp_path: Path) -> None:
        """A wake of 100 item ids shows the first few and counts the rest; --json keeps them all."""
        async with open_store(tmp_path / "host.db") as store, anyio.create_task_group() as tg:
            writer = GroupWriter(store)
            await tg.start(writer.run)
            await writer.submit(RecordTurn("scout", tuple(range(1, 101)), STARTED, STARTED, "held"))
            tg.cancel_scope.cancel()
        result = cli("turns", "--db", str(tmp_path / "host.db"))
        assert result.stdout.rstrip().endswith("wake=1,2,3,4,5,6,7,8,…+92")
        assert exported(tmp_path / "host.db")[0]["wakeItemIds"] == list(range(1, 101))

    async def test_a_peer_started_turn_names_its_trigger_and_messages_agent_shows_the_envelope(self, tmp_path: Path
                                                                                               ) -> None:
        """The plain line says `trigger=peer from NAME` for a turn whose waking item is a peer row (--json keeps its
        keys: the ids name the row); `messages --agent` lists that row with its envelope and metadata.peer."""
        text = envelope("lead", "Lead", "sibling", "status?")
        row = NewItem(role="user", content=[{"type": "text", "text": text}], created_at=STARTED, agent="scout",
                      participant="lead", metadata={"peer": {"from": "lead", "relationship": "sibling"}})
        async with open_store(tmp_path / "host.db") as store, anyio.create_task_group() as tg:
            writer = GroupWriter(store)
            await tg.start(writer.run)
            (written,) = await writer.write(InsertItems([row]))
            await writer.submit(RecordTurn("scout", (written.id,), STARTED, STARTED + 10, "completed"),
                                RecordTurn("scout", (written.id + 100,), STARTED, STARTED + 10, "completed"))
            tg.cancel_scope.cancel()
        first, second = cli("turns", "--db", str(tmp_path / "host.db")).stdout.splitlines()
        assert first.endswith(f"wake={written.id}  trigger=peer from lead") and "trigger=" not in second
        assert list(exported(tmp_path / "host.db")[0]) == EXPORT_KEYS
        (line,) = cli("messages", "--db", str(tmp_path / "host.db"), "--json", "--agent", "scout").stdout.splitlines()
        exported_row = json.loads(line)
        assert exported_row["agent"] == "scout" and exported_row["role"] == "user"
        assert exported_row["metadata"]["peer"] == {"from": "lead", "relationship": "sibling"}
        payload = parse_envelope(exported_row["content"][0]["text"])
        assert payload is not None and payload.message == "status?"

    async def test_an_empty_ledger_prints_nothing(self, tmp_path: Path) -> None:
        """A database with no turns prints nothing and exits 0."""
        async with open_store(tmp_path / "host.db"):
            pass
        assert exported(tmp_path / "host.db") == []

    async def test_piped_into_head_exits_0(self, tmp_path: Path) -> None:
        """`mcplhost turns | head -1`: the reader closing the pipe is a normal end, exit 0."""
        await seed(tmp_path / "host.db", 3000)
        argv = shlex.join([PYTHON, "-m", "mcplhost", "turns", "--db", str(tmp_path / "host.db")])
        result = subprocess.run(["bash", "-c", f"{argv} | head -1; echo \"status=${{PIPESTATUS[0]}}\""],
                                capture_output=True, text=True, env=cli_env(), cwd=REPO, timeout=60)
        first, status = result.stdout.splitlines()
        assert "scout" in first and status == "status=0" and result.stderr == ""


class TestTurnsErrors:
    def test_a_missing_database_is_one_line(self, tmp_path: Path) -> None:
        """No file at --db: exit 1 with one stderr line, nothing on stdout."""
        result = cli("turns", "--db", str(tmp_path / "absent.db"))
        assert result.returncode == 1 and result.stdout == ""
        (line,) = result.stderr.splitlines()
        assert "absent.db: no such database" in line

    def test_a_directory_is_named_as_one(self, tmp_path: Path) -> None:
        """--db naming a folder says it is a directory, exit 1."""
        result = cli("turns", "--db", str(tmp_path))
        assert result.returncode == 1 and "is a directory, not a database file" in result.stderr

    def test_a_bad_limit_is_a_usage_error(self, tmp_path: Path) -> None:
        """--limit -1 is exit 2 with one line naming the option."""
        result = cli("turns", "--db", str(tmp_path / "x.db"), "--limit", "-1")
        assert result.returncode == 2 and result.stderr.startswith("mcplhost turns: argument --limit: ")

    async def test_a_database_before_the_ledger_asks_for_migrate(self, tmp_path: Path) -> None:
        """A database at schema 2 (no turns table yet) is refused with one line, not a traceback."""
        db = tmp_path / "host.db"
        async with open_store(db):
            pass
        with sqlite3.connect(db) as conn:
            conn.execute("DELETE FROM schema_version WHERE version >= 3")  # 3 and every later one
            conn.execute("DROP TABLE turns")
        conn.close()
        result = cli("turns", "--db", str(db))
        assert result.returncode == 1 and "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
        assert "migrate" in result.stderr
