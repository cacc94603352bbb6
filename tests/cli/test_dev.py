"""`mcplhost dev` as a subprocess: the bundled stubs deliver into a real database, then it stops by itself."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from ..harness import PYTHON
from .support import cli, cli_env

SNAPSHOTS = Path(__file__).parent / "snapshots"
#: Spaced, deterministic events: the Discord-shaped stub's seven steps a second apart, then the Zulip-shaped
#: stub's three (from 9 s, so the two never interleave), no heartbeat within the run.
DETERMINISTIC = {"STUB_INTERVAL_S": "1", "ZULIP_DELAY_S": "9", "ZULIP_INTERVAL_S": "1",
                 "HEARTBEAT_INTERVAL_S": "3600"}
#: Long enough for the last Zulip item (about 11 s in) and its turn after a slow start on a busy machine.
SNAPSHOT_SECONDS = "14"
CLOCK = re.compile(r"^\d\d:\d\d:\d\d  ")
#: A turn's duration and its tokens (its context may or may not hold an echo that is still arriving): the figures
#: that move from run to run.
TURN_FIGURES = re.compile(r"\(\d+(\.\d+)? s(, \d+ tokens)?\)")
#: A line of an item the stubs staged (not an echo of the agent's own words): what starts a block of the feed.
STAGED = re.compile(r"^HH:MM:SS  (stub|zulip) .*  (?!Scout \(echo\))[^ :]+: ")


def normalised(text: str) -> str:
    lines = (CLOCK.sub("HH:MM:SS  ", line) for line in text.splitlines())
    return "\n".join(TURN_FIGURES.sub("(S s, N tokens)", line) for line in lines) + "\n"


def blocks(text: str, *, ordered: bool = False) -> list[list[str]]:
    """The feed cut before each staged item, each block's lines sorted.

    What one staged item causes (its wake, the turn's tool call, publishes and their echoes) runs in tasks of
    their own, so the order inside a block may vary; the blocks, a second apart, may not.
    """
    found: list[list[str]] = []
    for line in text.splitlines():
        if not found or STAGED.match(line) or line.endswith(("  ready: stub, zulip, heartbeat", "  stopping")):
            found.append([])
        found[-1].append(line)
    return found if ordered else [sorted(block) for block in found]


def in_order(block: list[str], *parts: str) -> bool:
    """Whether the first line holding each part (of those the block has) comes in the order given."""
    found = [next(i for i, line in enumerate(block) if part in line) for part in parts
             if any(part in line for line in block)]
    return found == sorted(found)


class TestDev:
    def test_dev_stores_items_from_the_bundled_stubs_and_exits_0(self, tmp_path) -> None:
        """dev --seconds 3 --db X runs the stubs, shows what arrives, stores it in X and exits 0."""
        db = tmp_path / "dev.db"
        result = cli("dev", "--seconds", "3", "--db", str(db), cwd=tmp_path, timeout=60)
        assert result.returncode == 0, result.stderr[-2000:]
        export = cli("messages", "--db", str(db), "--json")
        items = [json.loads(line) for line in export.stdout.splitlines()]
        assert items, result.stderr[-2000:]
        assert {item["metadata"]["serverId"] for item in items} <= {"stub", "heartbeat", "console"}
        first = items[0]
        assert first["metadata"]["serverId"] == "stub" and first["participant"] == "Alice"
        assert first["content"][-1]["text"] == "Good morning, everyone."
        assert "Good morning, everyone." in result.stdout  # the live view
        assert f"messages --db {db}" in result.stderr.splitlines()[-1]

    def test_the_plain_live_view_matches_its_snapshot(self, tmp_path) -> None:
        """Not a tty: items (thread included), wakes, tool calls, turns, drafts and publishes as timed lines cut to
        80 columns, no log lines, each stub's quirks explained on stderr."""
        result = cli("dev", "--seconds", SNAPSHOT_SECONDS, cwd=tmp_path, env=DETERMINISTIC, timeout=60)
        assert result.returncode == 0, result.stderr[-2000:]
        feed = normalised(result.stdout)
        assert blocks(feed) == blocks((SNAPSHOTS / "dev.txt").read_text(encoding="utf-8")), result.stdout
        for block in blocks(feed, ordered=True):  # inside a block, what must come first does
            assert in_order(block, "wake scout", "tool scout", "turn scout"), feed
            assert in_order(block, "wake scout", "publish scout", "(echo)"), feed
        assert all(len(line) <= 80 for line in result.stdout.splitlines() + result.stderr.splitlines())
        intro, *explained, last = result.stderr.splitlines()
        assert intro.startswith("mcplhost dev: database mcplhost-dev.db") and "-v shows the log" in intro
        assert [line.split(":")[0] for line in explained if not line.startswith("    ")] == [
            "  stub", "  zulip", "  heartbeat", "  console"]
        assert last == "mcplhost dev: stopped; read it with: mcplhost messages --db mcplhost-dev.db"

    @pytest.mark.parametrize(("args", "json_lines"), [(["-v"], False), (["--log-format", "json"], True)])
    def test_log_lines_are_shown_when_asked_for(self, tmp_path, args: list[str], json_lines: bool) -> None:
        """-v shows the log on stderr (console format); --log-format json is honoured as JSON lines."""
        result = cli("dev", "--seconds", "2", *args, cwd=tmp_path, env=DETERMINISTIC, timeout=60)
        assert result.returncode == 0, result.stderr[-2000:]
        logged = [line for line in result.stderr.splitlines() if "host.ready" in line]
        assert len(logged) == 1, result.stderr
        if json_lines:
            assert json.loads(logged[0])["event"] == "host.ready"
        else:
            assert not logged[0].startswith("{")

    def test_help_names_the_defaults_it_uses(self) -> None:
        """dev --help says log lines are hidden unless asked for and that console is the default format."""
        text = " ".join(cli("dev", "--help").stdout.split())
        assert "hidden by default" in text and "console (default) or json" in text
        assert "./mcplhost-dev.db" in text

    @pytest.mark.parametrize("value", ["-1", "nan", "inf", "-inf", "1e400", "soon"])
    def test_a_bad_seconds_is_a_one_line_usage_error(self, tmp_path, value: str) -> None:
        """--seconds must be a finite number from 0 up: anything else is exit 2 and one stderr line."""
        result = cli("dev", "--seconds", value, cwd=tmp_path)
        assert result.returncode == 2 and result.stdout == ""
        (line,) = result.stderr.splitlines()
        assert line.startswith("mcplhost dev: argument --seconds: ") and "Traceback" not in line
        assert not (tmp_path / "mcplhost-dev.db").exists()

    def test_lines_typed_into_dev_are_stored_as_console_input(self, tmp_path) -> None:
        """A line on dev's stdin is stored as a surface item from "console" and shown in the live view."""
        result = subprocess.run([PYTHON, "-m", "mcplhost", "dev", "--seconds", "3"], input="hello, host\n",
                                capture_output=True, text=True, cwd=tmp_path, env=cli_env(DETERMINISTIC), timeout=60)
        assert result.returncode == 0, result.stderr[-2000:]
        assert any(line.endswith("console  operator: hello, host") for line in result.stdout.splitlines())
        export = cli("messages", "--db", str(tmp_path / "mcplhost-dev.db"), "--json")
        (item,) = [json.loads(line) for line in export.stdout.splitlines()
                   if json.loads(line)["metadata"].get("serverId") == "console"]
        assert item["content"][-1]["text"].endswith("hello, host")

    def test_a_db_in_a_missing_folder_is_refused(self, tmp_path) -> None:
        """dev creates its database file but not a folder someone mistyped."""
        result = cli("dev", "--seconds", "1", "--db", str(tmp_path / "nowhere" / "dev.db"), cwd=tmp_path)
        assert result.returncode == 1
        (line,) = result.stderr.splitlines()
        assert f"the folder {tmp_path / 'nowhere'} does not exist" in line
