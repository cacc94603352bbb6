"""The offline commands, in-process (a closed pipe as a subprocess): messages (export shape, --limit, --channel, --agent), migrate, --version."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from mcplhost import __version__
from mcplhost.store import NewItem, open_store
from mcplhost.store.migrate import load_migrations

from ..harness import CHAT_GRANT, CHAT_MANIFEST, PYTHON, REPO, config_with, record, scripted, wait_for
from ..memory_pair import memory_host
from .support import cli, cli_env

EXPORT_KEYS = ["id", "agent", "participant", "role", "content", "metadata", "createdAt"]
HEX64 = re.compile(r"^[0-9a-f]{64}$")


async def seed(db: Path, count: int = 10) -> None:
    """`count` items: even ones in channel a, odd ones in b; every third belongs to agent scout."""
    async with open_store(db) as store:
        await store.items.insert_many([
            NewItem(role="user", content=[{"type": "text", "text": f"item {n}"}],
                    metadata={"serverId": "disc", "channelId": "disc:g1:a" if n % 2 == 0 else "disc:g1:b"},
                    created_at=1_790_000_000_000 + n, agent="scout" if n % 3 == 0 else None, participant="Alice")
            for n in range(count)
        ])


def exported(db: Path, *args: str) -> list[dict]:
    result = cli("messages", "--db", str(db), "--json", *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def exported_texts(items: list[dict]) -> list[str]:
    return [item["content"][-1]["text"] for item in items]


class TestMessagesExport:
    async def test_a_stored_message_exports_in_the_documented_shape(self, tmp_path) -> None:
        """A message that went through the host exports with docs/provenance.md §6's keys, in order, and real values."""
        channel = {"id": "disc:g1:room", "type": "disc", "label": "#room", "direction": "bidirectional", "address": {}}
        steps = [{"request": "channels/register", "params": {"channels": [channel]}},
                 {"request": "channels/incoming", "params": {"messages": [
                     {"channelId": "disc:g1:room", "messageId": "m-1", "author": {"id": "u1", "name": "Alice"},
                      "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": "hello"}],
                      "metadata": {"mentions": ["@scout"]}}]}}]
        spec = scripted("disc", {"manifest": CHAT_MANIFEST, "steps": steps}, tmp_path, grant=CHAT_GRANT)
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "disc").done)
        result = cli("messages", "--db", str(tmp_path / "host.db"), "--json")
        (line,) = result.stdout.splitlines()
        item = json.loads(line)
        assert list(item) == EXPORT_KEYS
        assert item["id"] == 1 and item["agent"] is None and item["participant"] == "Alice" and item["role"] == "user"
        assert item["content"] == [{"type": "text", "text": "[source: disc / disc:g1:room · #room]"},
                                   {"type": "text", "text": "hello"}]
        meta = item["metadata"]
        assert (meta["serverId"], meta["channelId"], meta["messageId"]) == ("disc", "disc:g1:room", "m-1")
        assert meta["threadId"] is None and meta["eventId"] is None and meta["tags"] == []
        source = {"kind": "channel", "lane": "channels/incoming", "serverId": "disc", "channelId": "disc:g1:room",
                  "label": "#room"}
        assert source.items() <= meta["source"].items() and isinstance(meta["source"]["acceptedAt"], int)
        assert meta["sourceHeader"] == "[source: disc / disc:g1:room · #room]"
        assert HEX64.match(meta["sourceBodyDigest"]) and HEX64.match(meta["storedBodyDigest"])
        assert meta["adapter"] == {"mentions": ["@scout"]}
        assert isinstance(item["createdAt"], int) and item["createdAt"] == meta["source"]["acceptedAt"]

    async def test_all_items_oldest_first(self, tmp_path) -> None:
        """Without filters every item is printed, one JSON object per line, by ascending id."""
        await seed(tmp_path / "host.db")
        items = exported(tmp_path / "host.db")
        assert [i["id"] for i in items] == list(range(1, 11))
        assert exported_texts(items) == [f"item {n}" for n in range(10)]

    async def test_limit_gives_the_newest_n_oldest_first(self, tmp_path) -> None:
        """--limit 3 prints the three newest items, still oldest first."""
        await seed(tmp_path / "host.db")
        assert exported_texts(exported(tmp_path / "host.db", "--limit", "3")) == ["item 7", "item 8", "item 9"]

    async def test_limit_larger_than_the_store_and_zero(self, tmp_path) -> None:
        """--limit beyond the row count prints everything; --limit 0 prints nothing."""
        await seed(tmp_path / "host.db", 4)
        assert len(exported(tmp_path / "host.db", "--limit", "40")) == 4
        assert exported(tmp_path / "host.db", "--limit", "0") == []

    async def test_a_negative_limit_is_a_usage_error(self, tmp_path) -> None:
        """--limit -1 is refused by the argument parser (exit 2), not a traceback."""
        await seed(tmp_path / "host.db", 1)
        result = cli("messages", "--db", str(tmp_path / "host.db"), "--limit", "-1")
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert "--limit" in result.stderr.splitlines()[-1]

    async def test_channel_and_agent_filter(self, tmp_path) -> None:
        """--channel keeps one channel's items, --agent one agent's rows, together with --limit they combine."""
        db = tmp_path / "host.db"
        await seed(db)
        assert exported_texts(exported(db, "--channel", "disc:g1:b")) == [f"item {n}" for n in (1, 3, 5, 7, 9)]
        assert exported_texts(exported(db, "--agent", "scout")) == [f"item {n}" for n in (0, 3, 6, 9)]
        assert exported_texts(exported(db, "--agent", "scout", "--channel", "disc:g1:a", "--limit", "1")) == ["item 6"]
        assert exported(db, "--channel", "nowhere") == []

    async def test_without_json_one_readable_line_per_item(self, tmp_path) -> None:
        """The console listing has one line per item with its id, role, participant and text."""
        await seed(tmp_path / "host.db", 3)
        result = cli("messages", "--db", str(tmp_path / "host.db"))
        lines = result.stdout.splitlines()
        assert len(lines) == 3
        assert lines[0].split() == ["1", "user", "Alice", "item", "0"]

    def test_a_missing_database_is_one_line(self, tmp_path) -> None:
        """A database that does not exist is named on one stderr line, exit 1."""
        result = cli("messages", "--db", str(tmp_path / "absent.db"))
        assert result.returncode == 1
        (line,) = result.stderr.splitlines()
        assert "absent.db: no such database" in line


class TestMigrate:
    def test_migrate_creates_and_then_has_nothing_to_do(self, tmp_path) -> None:
        """A new file gets every migration; a second run applies none. stdout has only the summary."""
        newest = len(load_migrations())
        first = cli("migrate", "--db", str(tmp_path / "new.db"))
        assert first.returncode == 0
        versions = ", ".join(map(str, range(1, newest + 1)))
        assert first.stdout.splitlines() == [f"applied {newest} migration(s): {versions}"]
        again = cli("migrate", "--db", str(tmp_path / "new.db"))
        assert again.returncode == 0 and again.stdout.splitlines() == ["applied 0 migration(s)"]

    async def test_a_migrated_database_is_readable_by_messages(self, tmp_path) -> None:
        """After migrate, messages reads the (empty) database without complaint."""
        assert cli("migrate", "--db", str(tmp_path / "new.db")).returncode == 0
        assert exported(tmp_path / "new.db") == []


class TestVersion:
    def test_version(self) -> None:
        """--version prints the package version and exits 0."""
        result = cli("--version")
        assert result.returncode == 0 and result.stdout.strip() == f"mcplhost {__version__}"


class TestMessagesIntoAPipe:
    async def test_a_reader_that_stops_early_gets_no_traceback(self, tmp_path) -> None:
        """`mcplhost messages | head -1`: the closed pipe ends the export quietly, with exit 0."""
        await seed(tmp_path / "host.db", 5000)  # far more than a pipe buffer holds
        process = subprocess.Popen([PYTHON, "-m", "mcplhost", "messages", "--db", str(tmp_path / "host.db"), "--json"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(), cwd=REPO)
        try:
            assert process.stdout is not None and process.stderr is not None
            assert json.loads(process.stdout.readline())["id"] == 1
            process.stdout.close()
            assert process.wait(timeout=30) == 0
            assert process.stderr.read() == b""
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            process.stderr.close()  # type: ignore[union-attr]

    @pytest.mark.parametrize("command", [["messages"], ["search", "item", "--limit", "5000"]])
    async def test_piped_into_head_exits_0(self, tmp_path, command: list[str]) -> None:
        """`mcplhost messages ... | head -1` (and search): the reader closing the pipe is a normal end, exit 0."""
        await seed(tmp_path / "host.db", 5000)
        argv = shlex.join([PYTHON, "-m", "mcplhost", command[0], "--db", str(tmp_path / "host.db"), *command[1:]])
        result = subprocess.run(["bash", "-c", f"{argv} | head -1; echo \"status=${{PIPESTATUS[0]}}\""],
                                capture_output=True, text=True, env=cli_env(), cwd=REPO, timeout=60)
        first, status = result.stdout.splitlines()
        assert "item" in first and status == "status=0" and result.stderr == ""
