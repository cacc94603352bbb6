"""`mcplhost dev`: the bundled stubs deliver into a real database, then it stops by itself.

In-process on a stepped clock (tests/cli/clock.py) for what dev shows and stores; as a real process on wall
time where the process is what is tested: a terminal, stdin, SIGINT, and `--seconds` ending it by itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mcplhost.connectors.mcpl_server import TEST_CLOCK_ENV
from mcplhost.dev import DEV_STUB_TOKEN, ELLIPSIS, PLAIN_WIDTH, fit

from ..harness import PYTHON
from .clock import SteppedClock
from .support import Captured, cli, cli_env

SNAPSHOTS = Path(__file__).parent / "snapshots"
#: Spaced, deterministic events on wall time: the Discord-shaped stub's seven steps a second apart, then the
#: Zulip-shaped stub's three (from 9 s, so the two never interleave), no heartbeat within the run; scout's
#: debounce and a platform's echo short, since what follows a typed line waits for both.
DETERMINISTIC = {"STUB_INTERVAL_S": "1", "ZULIP_DELAY_S": "12", "ZULIP_INTERVAL_S": "1",
                 "HEARTBEAT_INTERVAL_S": "3600", "STAGE_ECHO_DELAY_S": "0.02", "DEV_DEBOUNCE_MS": "20"}
#: The same order on the stepped clock, where a step's seconds cost no wall time: the Zulip-shaped stub long
#: after the other's last step, the deadline later still. Only the debounce and a platform's echo take wall
#: time there (the clock waits for what each step causes).
STEPPED = {**DETERMINISTIC, "ZULIP_DELAY_S": "100"}
STEPPED_SECONDS = "1000"
#: The timed scenarios of a dev run, each one party of the clock: the three timed stubs and dev's deadline.
STEPPED_PARTIES = 4
CLOCK = re.compile(r"^\d\d:\d\d:\d\d  ")
#: A turn's duration and its tokens (its context may or may not hold an echo that is still arriving): the figures
#: that move from run to run.
TURN_FIGURES = re.compile(r"\(\d+(\.\d+)? s(, \d+ tokens)?\)")
#: A draft's explain hint names the item that woke the turn: its id depends on when echoes were stored.
EXPLAIN_HINT = re.compile(r"why: mcplhost explain (\d+) --db (\S+)")
#: Scout's own words coming back, shown before the host had recorded the publish they echo: on a busy machine the
#: platform's echo (STAGE_ECHO_DELAY_S after its answer) can be stored first. The host allows for it (the wake
#: checks its items again, docs/agents.md#echoes), so the snapshot reads such a line as the echo it is; the view's
#: "(echo)" mark itself is tested in tests/test_dev.py.
ECHO_NOT_YET_KNOWN = re.compile(r"^(HH:MM:SS  (?:stub|zulip|console)\b.*?  Scout): ")
#: A line of an item the stubs staged (not an echo of the agent's own words): what starts a block of the feed.
STAGED = re.compile(r"^HH:MM:SS  (stub|zulip) .*  (?!Scout \(echo\))[^ :]+: ")


#: How long dev may take to exit once it has printed "stopped": its connectors and store are closed by then.
EXIT_AFTER_STOPPED_S = 5.0
STOPPED = "mcplhost dev: stopped"


class OnPty:
    """`mcplhost dev ARGS` with stdin, stdout and stderr on a pseudo-terminal of `columns` columns (0: no size)."""

    def __init__(self, tmp_path: Path, *args: str, columns: int, env: dict[str, str] | None = None) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24 if columns else 0, columns, 0, 0))
        self.process = subprocess.Popen([PYTHON, "-m", "mcplhost", "dev", *args], stdin=slave, stdout=slave,
                                        stderr=slave, cwd=tmp_path, start_new_session=True,
                                        env=cli_env({**DETERMINISTIC, "NO_COLOR": "1", **(env or {})}))
        os.close(slave)
        self.writer = self.master
        self.output = b""
        self.stopped_at: float | None = None

    def text(self) -> str:
        return self.output.decode("utf-8", "replace").replace("\r\n", "\n")

    def read_until(self, condition, timeout: float) -> bool:
        """Read the terminal until `condition(text)` holds or it closes (the process exited) or `timeout` ends."""
        deadline = time.monotonic() + timeout
        while not condition(self.text()) and (left := deadline - time.monotonic()) > 0:
            if not select.select([self.master], [], [], left)[0]:
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every slave end is closed
                return condition(self.text())
            if not chunk:
                break
            self.output += chunk
            if self.stopped_at is None and STOPPED in self.text():
                self.stopped_at = time.monotonic()
        return condition(self.text())

    def type(self, line: str) -> None:
        os.write(self.writer, line.encode() + b"\n")

    def wait_for_exit(self, timeout: float) -> int | None:
        """The exit code once the terminal closes, or None when dev is still running after `timeout`."""
        self.read_until(lambda _: False, timeout)
        try:
            return self.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.master)
        if self.writer != self.master:
            os.close(self.writer)


class OnPipes(OnPty):
    """`mcplhost dev ARGS` with stdin a pipe (or the file `stdin`) and stdout and stderr one pipe: no terminal."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None,
                 stdin: Path | None = None) -> None:
        if stdin is None:
            stdin_read, self.writer = os.pipe()
        else:
            stdin_read = os.open(stdin, os.O_RDONLY)
            self.writer = os.open(os.devnull, os.O_WRONLY)  # nothing more is typed
        self.master, stdout_write = os.pipe()
        self.process = subprocess.Popen([PYTHON, "-m", "mcplhost", "dev", *args], stdin=stdin_read,
                                        stdout=stdout_write, stderr=stdout_write, cwd=tmp_path,
                                        env=cli_env({**DETERMINISTIC, **(env or {})}))
        os.close(stdin_read)
        os.close(stdout_write)
        self.output = b""
        self.stopped_at = None


def normalised(text: str) -> str:
    lines = (CLOCK.sub("HH:MM:SS  ", line) for line in text.splitlines())
    lines = (TURN_FIGURES.sub("(S s, N tokens)", line) for line in lines)
    lines = (as_echo(line) for line in lines)
    return "\n".join(EXPLAIN_HINT.sub(r"why: mcplhost explain ID --db \2", line) for line in lines) + "\n"


def as_echo(line: str) -> str:
    """A line ECHO_NOT_YET_KNOWN matches as the view shows an echo: marked, then cut to the plain width again."""
    if not ECHO_NOT_YET_KNOWN.match(line):
        return line
    return fit(ECHO_NOT_YET_KNOWN.sub(r"\1 (echo): ", line.removesuffix(ELLIPSIS)), PLAIN_WIDTH)


def echoed(said: str) -> Callable[[str], bool]:
    """Whether the view shows Scout's `said` come back on the console: marked as the echo, or not yet known as
    one (ECHO_NOT_YET_KNOWN)."""
    shown = re.compile(r"console  Scout(?: \(echo\))?: " + re.escape(said))
    return lambda text: shown.search(text) is not None


def blocks(text: str, *, ordered: bool = False) -> list[list[str]]:
    """The feed cut before each staged item, each block's lines sorted.

    What one staged item causes (its wake, the turn's tool call, publishes and their echoes) runs in tasks of
    their own, so the order inside a block may vary; the blocks, a second apart, may not.
    """
    found: list[list[str]] = []
    for line in text.splitlines():
        if not found or STAGED.match(line) or line.endswith(("  ready: stub, zulip, heartbeat, console", "  stopping")):
            found.append([])
        found[-1].append(line)
    return found if ordered else [sorted(block) for block in found]


def in_order(block: list[str], *parts: str) -> bool:
    """Whether the first line holding each part (of those the block has) comes in the order given."""
    found = [next(i for i, line in enumerate(block) if part in line) for part in parts
             if any(part in line for line in block)]
    return found == sorted(found)


def stepped_dev(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
                settled: Callable[[str], bool] | None = None) -> subprocess.CompletedProcess[str]:
    """`mcplhost dev ARGS` in-process, its timed steps and deadline on a stepped clock that moves on when
    `settled(live view so far)` holds (by default: once the view says ready)."""
    view = Captured()
    with SteppedClock(tmp_path / "clock.sock", parties=STEPPED_PARTIES) as clock:
        clock.settled = lambda: (settled or shown_ready)(view.peek())
        view.on_write = clock.poke
        return cli("dev", *args, cwd=tmp_path, env={**(env or {}), TEST_CLOCK_ENV: str(clock.path)}, stdout=view)


def shown_ready(view: str) -> bool:
    return "  ready: " in view


class TestDev:
    def test_dev_stores_items_from_the_bundled_stubs_and_exits_0(self, tmp_path) -> None:
        """dev --seconds 3 --db X runs the stubs, shows what arrives, stores it in X and exits 0."""
        db = tmp_path / "dev.db"
        result = stepped_dev(tmp_path, "--seconds", "3", "--db", str(db))
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

    def test_a_second_run_in_the_same_folder_shows_the_whole_scenario_again(self, tmp_path) -> None:
        """The second dev in one folder starts from a fresh database and says so: the stubs' messages are stored
        and shown again (they were deduplicated against the first run's database, and its demo showed nothing),
        and the database holds one run's items, not two."""
        runs = [stepped_dev(tmp_path, "--seconds", "3") for _ in range(2)]
        for result in runs:
            assert result.returncode == 0, result.stderr[-2000:]
            assert "stub #general  Alice: Good morning, everyone." in result.stdout, result.stdout
        first, second = (result.stderr.splitlines() for result in runs)
        fresh = "  a fresh database each run: the last run's was replaced, so it all plays again"
        assert fresh not in first and fresh == second[1]
        export = cli("messages", "--db", str(tmp_path / "mcplhost-dev.db"), "--json").stdout.splitlines()
        texts = [json.loads(line)["content"][-1]["text"] for line in export]
        assert texts.count("Good morning, everyone.") == 1

    def test_a_database_dev_did_not_make_is_never_replaced(self, tmp_path) -> None:
        """--db naming a file without dev's config beside it (a daemon's database, say) exits 1 with one line
        and leaves the file as it was: dev removes only what an earlier dev run made."""
        db = tmp_path / "host.db"
        db.write_bytes(b"someone's data")
        result = cli("dev", "--seconds", "1", "--db", str(db), cwd=tmp_path)
        assert result.returncode == 1
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"mcplhost: {db}: not a database an earlier mcplhost dev made"), line
        assert db.read_bytes() == b"someone's data" and not (tmp_path / "host.db.toml").exists()

    def test_the_plain_live_view_matches_its_snapshot(self, tmp_path) -> None:
        """Not a tty: items (thread included), wakes, tool calls, turns, drafts and publishes as timed lines cut to
        80 columns, no log lines, each stub's quirks explained on stderr. The stubs' steps come on a stepped
        clock, each once the view shows what the one before caused, so the run takes no wall time of its own."""
        expected = blocks((SNAPSHOTS / "dev.txt").read_text(encoding="utf-8"))

        def settled(view: str) -> bool:
            """Every block so far as the snapshot has it (the last one whole), and the run not over yet."""
            shown = blocks(normalised(view))
            return 0 < len(shown) < len(expected) and shown == expected[:len(shown)]

        result = stepped_dev(tmp_path, "--seconds", STEPPED_SECONDS, env=STEPPED, settled=settled)
        assert result.returncode == 0, result.stderr[-2000:]
        feed = normalised(result.stdout)
        assert blocks(feed) == expected, result.stdout
        for block in blocks(feed, ordered=True):  # inside a block, what must come first does
            assert in_order(block, "wake scout", "tool scout", "turn scout"), feed
            assert in_order(block, "wake scout", "publish scout", "(echo)"), feed
        assert all(len(line) <= 80 for line in result.stdout.splitlines() + result.stderr.splitlines())
        intro, *explained, last = result.stderr.splitlines()
        assert intro.startswith("mcplhost dev: database mcplhost-dev.db") and "-v shows the log" in intro
        assert [line.split(":")[0] for line in explained if not line.startswith("    ")] == [
            "  stub", "  zulip", "  heartbeat", "  console", "  agents", "  docs"]
        assert last == "mcplhost dev: stopped; read it with: mcplhost messages --db mcplhost-dev.db"
        self.check_explain_hints(tmp_path, result.stdout)

    @staticmethod
    def check_explain_hints(tmp_path: Path, feed: str) -> None:
        """Each draft's hint runs as printed (dev's config found beside the database) and names that draft's
        reason; the stub's token that scout would have posted is stored nowhere."""
        drafts = re.findall(r"draft scout: (\S+), nothing published", feed)
        hints = EXPLAIN_HINT.findall(feed)
        assert len(hints) == len(drafts) == 3, feed
        for (item, db), reason in zip(hints, drafts):
            answer = cli("explain", item, "--db", db, "--json", cwd=tmp_path)
            assert answer.returncode == 0, answer.stderr
            scout = json.loads(answer.stdout.splitlines()[0])
            assert scout["agent"] == "scout" and scout["decision"] == "woke"
            assert [d["reason"] for d in scout["drafts"]] == [reason]
        assert "secret" in drafts
        token = DEV_STUB_TOKEN.encode()
        assert not any(token in path.read_bytes() for path in tmp_path.glob("mcplhost-dev.db*")
                       if not path.name.endswith(".toml"))

    @pytest.mark.parametrize(("args", "json_lines"), [(["-v"], False), (["--log-format", "json"], True)])
    def test_log_lines_are_shown_when_asked_for(self, tmp_path, args: list[str], json_lines: bool) -> None:
        """-v shows the log on stderr (console format); --log-format json is honoured as JSON lines."""
        result = stepped_dev(tmp_path, "--seconds", "2", *args, env=DETERMINISTIC)
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

    def test_a_line_typed_to_scout_wakes_it_and_its_reply_says_the_line_back(self, tmp_path) -> None:
        """`@scout ...` on stdin is a mention on the console channel: scout wakes, its reply is published to the
        console (outbox row delivered) and comes back as an echo in the view; a plain line is stored, wakes no one."""
        echo = echoed("You said: @scout please answer the console")
        dev = OnPipes(tmp_path, env={"STUB_MESSAGES": "1"})
        try:
            dev.type("@scout please answer the console")
            dev.type("hello, host")
            assert dev.read_until(echo, timeout=40), dev.text()
            dev.process.send_signal(signal.SIGINT)
            assert dev.wait_for_exit(timeout=30) == 0, dev.text()[-2000:]
        finally:
            dev.close()
        feed = [CLOCK.sub("", line) for line in dev.text().splitlines()]
        assert "console  operator: @scout please answer the console" in feed, dev.text()
        assert "console  operator: hello, host" in feed
        assert "publish scout → console" in feed
        db = str(tmp_path / "mcplhost-dev.db")
        export = [json.loads(line) for line in cli("messages", "--db", db, "--json").stdout.splitlines()]
        typed_items = [item for item in export if item["metadata"].get("serverId") == "console"
                       and item["participant"] == "operator"]
        assert [item["metadata"]["tags"] for item in typed_items] == [["chat:addressed", "chat:mention"], []]
        turns = [json.loads(line) for line in cli("turns", "--db", db, "--json").stdout.splitlines()]
        assert [turn["wakeItemIds"] for turn in turns] == [[typed_items[0]["id"]]]
        outbox = [json.loads(line) for line in cli("outbox", "--db", db, "--json").stdout.splitlines()]
        assert outbox and {(row["serverId"], row["state"]) for row in outbox} == {("console", "delivered")}

    def test_lines_from_a_file_on_stdin_are_typed_lines_too(self, tmp_path) -> None:
        """`mcplhost dev < lines.txt`: a regular file (which the event loop cannot wait on) is read all the same."""
        lines = tmp_path / "lines.txt"
        lines.write_text("first, no one addressed\n@Scout: from a file\n", encoding="utf-8")
        echo = echoed("You said: @Scout: from a file")
        dev = OnPipes(tmp_path, env={"STUB_MESSAGES": "1"}, stdin=lines)
        try:
            assert dev.read_until(echo, timeout=40), dev.text()
            dev.process.send_signal(signal.SIGINT)
            assert dev.wait_for_exit(timeout=30) == 0, dev.text()[-2000:]
        finally:
            dev.close()
        assert "console  operator: first, no one addressed" in [CLOCK.sub("", line) for line in dev.text().splitlines()]

    def test_a_db_in_a_missing_folder_is_refused(self, tmp_path) -> None:
        """dev creates its database file but not a folder someone mistyped."""
        result = cli("dev", "--seconds", "1", "--db", str(tmp_path / "nowhere" / "dev.db"), cwd=tmp_path)
        assert result.returncode == 1
        (line,) = result.stderr.splitlines()
        assert f"the folder {tmp_path / 'nowhere'} does not exist" in line


class TestOnATerminal:
    def test_seconds_ends_dev_on_a_terminal_of_no_size_and_every_line_has_its_text(self, tmp_path) -> None:
        """On a pty reporting 0 columns, --seconds 3 exits 0 by itself, promptly after "stopped" (no Enter
        needed), and the feed is 80 columns wide: lines keep their text instead of collapsing to "…"."""
        dev = OnPty(tmp_path, "--seconds", "3", columns=0)
        try:
            code = dev.wait_for_exit(timeout=45)
            assert code == 0, dev.text()[-2000:]
            assert dev.stopped_at is not None and time.monotonic() - dev.stopped_at < EXIT_AFTER_STOPPED_S
            feed = [line for line in dev.text().splitlines() if CLOCK.match(line)]
            assert any(line.endswith("stub #general  Alice: Good morning, everyone.") for line in feed), dev.text()
            assert all(len(line) <= 80 for line in dev.text().splitlines() if not line.startswith(STOPPED))
            assert not [line for line in feed if line.endswith("…") and len(line) < 80]
        finally:
            dev.close()

    def test_a_narrow_terminal_cuts_lines_to_its_width(self, tmp_path) -> None:
        """A pty of 40 columns: no line is wider, and a cut line ends in an ellipsis (the stubs and the deadline
        on a stepped clock: the first stub message comes a step before the end, at once)."""
        with SteppedClock(tmp_path / "clock.sock", parties=STEPPED_PARTIES) as clock:
            dev = OnPty(tmp_path, "--seconds", "2", columns=40, env={TEST_CLOCK_ENV: str(clock.path)})
            try:
                assert dev.wait_for_exit(timeout=45) == 0, dev.text()[-2000:]
                lines = [line for line in dev.text().splitlines() if not line.startswith(STOPPED)]  # copied whole
                assert all(len(line) <= 40 for line in lines) and any(line.endswith("…") for line in lines), lines
            finally:
                dev.close()

    def test_a_line_typed_on_the_terminal_wakes_scout_and_sigint_ends_dev(self, tmp_path) -> None:
        """Typed on the tty (canonical mode), `@scout ...` is answered in the view; then SIGINT (Ctrl-C) stops
        dev with exit 0 and it returns to the shell at once."""
        dev = OnPty(tmp_path, columns=200, env={"STUB_MESSAGES": "1"})
        try:
            assert dev.read_until(lambda text: "  ready: " in text, timeout=30), dev.text()
            dev.type("@scout answer the terminal")
            echo = echoed("You said: @scout answer the terminal")
            assert dev.read_until(echo, timeout=30), dev.text()
            dev.process.send_signal(signal.SIGINT)
            assert dev.wait_for_exit(timeout=30) == 0, dev.text()[-2000:]
            assert dev.stopped_at is not None and time.monotonic() - dev.stopped_at < EXIT_AFTER_STOPPED_S
        finally:
            dev.close()
