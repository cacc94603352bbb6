"""mcplhost/dev.py's pure parts: fitting a line to the terminal, printable text, item and event lines, typed lines,
the settings dev takes from its environment; the console connector's mentions."""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import pty
import struct
import termios
import tomllib

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mcplhost.config import DEFAULT_DEBOUNCE_MS, load_config
from mcplhost.connectors.console import typed
from mcplhost.connectors.mcpl_server import TEST_CLOCK_ENV, timed_steps
from mcplhost.connectors.stage import ECHO_DELAY_ENV, ECHO_DELAY_S, echo_delay_s
from mcplhost.dev import (
    DEBOUNCE_ENV,
    ELLIPSIS,
    HEARTBEAT_DEFAULTS,
    PLAIN_WIDTH,
    LineSplitter,
    LiveView,
    _toml_value,
    bundled_connectors,
    config_beside,
    describe_event,
    describe_item,
    dev_config,
    fit,
    printable,
    write_config,
)
from mcplhost.logs import LINES_PER_WINDOW, WINDOW_S
from mcplhost.ratelimit import WindowLimiter
from mcplhost.store import NewItem


def cells(text: str) -> int:
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 0 if unicodedata.combining(c) else 1
               for c in text)


class TestFit:
    @given(st.text(), st.integers(min_value=1, max_value=200))
    def test_a_fitted_line_never_exceeds_the_width_and_keeps_a_prefix(self, line: str, width: int) -> None:
        """Whatever the text (wide characters included), the result fits and starts like the line."""
        fitted = fit(line, width)
        assert cells(fitted) <= width
        assert fitted == line or (fitted.endswith(ELLIPSIS) and line.startswith(fitted[:-1]))

    def test_a_short_line_is_left_alone_and_a_long_one_ends_in_an_ellipsis(self) -> None:
        """Only a line wider than the width is cut."""
        assert fit("abc", 3) == "abc" and fit("abcd", 3) == "ab…" and fit("日本語", 4) == "日…"


class TestPrintable:
    def test_control_characters_cannot_reach_the_terminal(self) -> None:
        """A newline is shown as ⏎ and escapes or other controls as �, so a message cannot restyle the terminal."""
        assert printable("a\nb\tc\x1b[31md\x07") == "a ⏎ b c\N{REPLACEMENT CHARACTER}[31md\N{REPLACEMENT CHARACTER}"


class TestLines:
    def test_an_item_shows_where_who_and_the_body_without_its_header(self) -> None:
        """The source header is summarised as server and label; the body follows the participant."""
        header = "[source: stub / stub:g1:general · #general]"
        item = NewItem(role="user", content=[{"type": "text", "text": header}, {"type": "text", "text": "hi"}],
                       metadata={"serverId": "stub", "channelId": "stub:g1:general", "sourceHeader": header,
                                 "source": {"label": "#general", "lane": "channels/incoming"}},
                       created_at=0, participant="Alice")
        assert describe_item(item) == "stub #general  Alice: hi"

    def test_events_shown_are_the_host_s_and_warnings(self) -> None:
        """ready/stopping and warnings become lines; ordinary info events are left out."""
        assert describe_event({"event": "host.ready", "level": "info"}, ["a", "b"]) == "ready: a, b"
        assert describe_event({"event": "connector.up", "level": "info", "connector": "a"}, []) is None
        assert describe_event({"event": "rpc.junk_line", "level": "warning", "connector": "a", "reason": "bad"},
                              []) == "warning: a: rpc.junk_line (bad)"

    def test_the_view_writes_timed_fitted_lines(self) -> None:
        """Each line starts with HH:MM:SS and is cut to the view's width."""
        out = io.StringIO()
        LiveView(out, 20, now=lambda: 0.0).event({"event": "host.ready", "level": "info"})
        LiveView(out, 20).line(0.0, "x" * 40)
        first, second = out.getvalue().splitlines()
        assert first[2] == first[5] == ":" and first.endswith("  ready") and len(second) == 20


def test_the_bundled_connectors_are_the_runnable_modules() -> None:
    """`mcplhost connector --list`: programs only, not the helper library they share."""
    names = bundled_connectors()
    assert {"stub", "heartbeatish", "zulipish", "discordish", "console"} <= set(names)
    assert "mcpl_server" not in names and "scripted" not in names  # the tests' connector is not shipped


class TestDevAgent:
    def test_dev_runs_scout_waking_on_addressed_and_dm_and_its_child_woken_by_peers(self, tmp_path) -> None:
        """dev's config has two scripted agents (no network) in one tree: scout, waking on addressed and dm items,
        and scribe, its child, whom only peer messages wake (docs/peers.md#seeing-it)."""
        from mcplhost.dev import dev_config

        scout, scribe = dev_config(tmp_path / "dev.db").agents
        assert scout.backend.kind == "scripted" and scout.wake_on == ["addressed", "dm"]
        assert scribe.backend.kind == "scripted" and scribe.parent == "scout" and scribe.wake_on == []

    def test_a_peer_delivery_and_a_refused_send_are_one_line_each_in_the_view(self) -> None:
        """peer.delivered names sender, target and path; a send that was not admitted says why; admitted ones show
        as their delivery only (accepted or queued depends on timing, the delivery does not)."""
        guidance = {"event": "peer.delivered", "agent": "scribe", "sender": "scout", "relationship": "ancestor"}
        assert describe_event(guidance, []) == "peer scout → scribe: guidance"
        up = {"event": "peer.delivered", "agent": "scout", "sender": "scribe", "relationship": "descendant"}
        assert describe_event(up, []) == "peer scribe → scout: message from a descendant"
        refused = {"event": "peer.send", "agent": "a", "target": "b", "status": "refused", "reason": "duplicate"}
        assert describe_event(refused, []) == "peer a → b: refused (duplicate)"
        assert describe_event({**refused, "status": "queued", "reason": None}, []) is None

    def test_a_wake_and_a_turn_are_one_line_each_in_the_view(self) -> None:
        """agent.turn shows who, how it ended, how long and what it cost; agent.wake how many items woke it."""
        line = describe_event({"event": "agent.turn", "level": "info", "agent": "assistant", "outcome": "completed",
                               "seconds": 0.01, "tokens": 12}, [])
        assert line == "turn assistant: completed (0.01 s, 12 tokens)"
        wake = describe_event({"event": "agent.wake", "level": "info", "agent": "assistant", "items": 2,
                               "overflow": 0}, [])
        assert wake == "wake assistant: 2 items"

    def test_a_tool_call_a_draft_and_a_publish_are_one_line_each(self) -> None:
        """A tool call names the tool; a draft its reason; a publish its destination by label and thread."""
        tool = describe_event({"event": "agent.tool_called", "level": "info", "agent": "scout", "tool": "stub__echo",
                               "error": False}, [])
        assert tool == "tool scout: stub__echo"
        draft = describe_event({"event": "speech.draft", "level": "info", "agent": "scout",
                                "reason": "several_conversations", "chars": 12}, [])
        assert draft == "draft scout: several_conversations, nothing published"
        delivered = {"event": "outbox.delivered", "level": "info", "agent": "scout", "connector": "zulip",
                     "channel": "zulip:eng", "thread": "deploys", "message_id": "z-1"}
        assert describe_event(delivered, [], {("zulip", "zulip:eng"): "#eng"}) == "publish scout → zulip #eng › deploys"
        assert describe_event({**delivered, "thread": None}, []) == "publish scout → zulip zulip:eng"
        console = {**delivered, "connector": "console", "channel": "console", "thread": None}
        assert describe_event(console, [], {("console", "console"): "console"}) == "publish scout → console"

    def test_the_view_names_a_publish_s_channel_by_the_label_its_items_carry(self) -> None:
        """After an item from a channel, a publish to that channel shows its label; an echo is marked."""
        out = io.StringIO()
        view = LiveView(out, 200, now=lambda: 0.0)
        view.items([NewItem(role="user", content=[{"type": "text", "text": "hi"}], created_at=0, participant="Scout",
                            metadata={"serverId": "stub", "channelId": "stub:g1:random", "threadId": "t1",
                                      "echoOf": 7, "source": {"label": "#ops"}})])
        view.event({"event": "outbox.delivered", "level": "info", "agent": "scout", "connector": "stub",
                    "channel": "stub:g1:random", "thread": "t1"})
        item, publish = (line[10:] for line in out.getvalue().splitlines())
        assert item == "stub #ops › t1  Scout (echo): hi" and publish == "publish scout → stub #ops › t1"


class TestColour:
    def test_a_terminal_view_colours_event_lines_and_a_plain_one_never_does(self) -> None:
        """Colour only when asked (a tty): the wake line is wrapped in its SGR code, fitted before colouring."""
        wake = {"event": "agent.wake", "level": "info", "agent": "scout", "items": 1}
        plain, coloured = io.StringIO(), io.StringIO()
        LiveView(plain, 30, now=lambda: 0.0).event(wake)
        LiveView(coloured, 30, now=lambda: 0.0, colour=True).event(wake)
        assert "\x1b" not in plain.getvalue()
        assert coloured.getvalue() == "\x1b[33m" + plain.getvalue().rstrip("\n") + "\x1b[0m\n"


class TestTerminalWidth:
    @pytest.mark.parametrize(("columns", "width"), [(0, PLAIN_WIDTH), (40, 40), (132, 132)])
    def test_a_terminal_of_no_size_gets_the_plain_width(self, columns: int, width: int) -> None:
        """A pty reporting 0 columns is a terminal of unknown size: 80 columns, not 0 (every line an ellipsis)."""
        master, slave = pty.openpty()
        try:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 0, columns, 0, 0))
            with open(slave, "w", closefd=False) as out:
                assert LiveView.for_stream(out).width == width
        finally:
            os.close(master)
            os.close(slave)


#: Terminal input: any bytes, newlines often.
TYPED = st.lists(st.one_of(st.binary(max_size=50), st.just(b"\n"), st.text(max_size=30).map(str.encode)),
                 max_size=30)


class TestLineSplitter:
    @given(TYPED, st.integers(min_value=1, max_value=20))
    def test_lines_come_out_whole_however_the_reads_split_them(self, chunks: list[bytes], bound: int) -> None:
        """Each line (cut to the bound) comes out once, the same whatever the read boundaries; nothing held grows
        past the bound."""
        data = b"".join(chunks)
        splitter = LineSplitter(max_chars=bound)
        out: list[str] = []
        for chunk in chunks:
            out += splitter.feed(chunk)
            assert len(splitter.pending) <= splitter.max_bytes + 1
        out += splitter.end()
        whole = LineSplitter(max_chars=bound)
        assert out == whole.feed(data) + whole.end()
        assert all(len(line) <= bound for line in out)

    @given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=["Cs"]),
                            max_size=10), max_size=10))
    def test_short_lines_come_out_as_typed(self, lines: list[str]) -> None:
        splitter = LineSplitter(max_chars=10)
        assert splitter.feed("".join(line + "\n" for line in lines).encode()) == lines

    def test_an_endless_line_is_cut_and_its_rest_dropped_up_to_its_newline(self) -> None:
        """A paste without newlines holds at most the bound; what follows its newline is a line again."""
        splitter = LineSplitter(max_chars=5)
        assert splitter.feed(b"abcd") == [] and splitter.feed(b"efgh" * 5) == ["abcde"]  # past 4 bytes a character
        assert splitter.feed(b"ijklmnop" * 1000) == [] and not splitter.pending
        assert splitter.feed(b"q\nnext\n") == ["next"]


class TestConsoleMentions:
    """The console tags a line naming an agent by the one addressing rule (mcplhost/connectors/addressing.py)."""

    def test_a_mention_is_tagged_so_the_wake_rules_see_it(self) -> None:
        """The message of a mention carries chat:mention (chat:addressed by the closure); others no tag."""
        said = typed("@scout hello", ["scout"])
        assert said.tags == ["chat:mention"] and said.metadata == {"mentions": ["@scout"]}
        assert typed("hi @Scout and @lead", ["lead", "scout"]).metadata == {"mentions": ["@lead", "@scout"]}
        assert typed("scout: hi", ["scout"]).tags == ["chat:mention"]
        assert typed("hello", ["scout"]).tags == [] and typed("scouting, hi", ["scout"]).tags == []


class TestDevSettings:
    """What dev takes from its environment: the stubs' pace, the echo delay, scout's debounce, the test clock."""

    def test_the_test_clock_and_the_echo_delay_reach_the_connectors_only_when_set(self, tmp_path,
                                                                                monkeypatch) -> None:
        """Unset, no connector sees MCPL_TEST_CLOCK or STAGE_ECHO_DELAY_S (each keeps its default); set, every
        connector dev runs gets them (the console echoes what scout publishes too)."""
        monkeypatch.delenv(TEST_CLOCK_ENV, raising=False)
        monkeypatch.delenv(ECHO_DELAY_ENV, raising=False)
        plain = {c.name: c.env for c in dev_config(tmp_path / "dev.db", console_socket=tmp_path / "c.sock").connectors}
        assert not any({TEST_CLOCK_ENV, ECHO_DELAY_ENV} & env.keys() for env in plain.values())
        monkeypatch.setenv(TEST_CLOCK_ENV, str(tmp_path / "clock.sock"))
        monkeypatch.setenv(ECHO_DELAY_ENV, "0.05")
        stepped = {c.name: c.env for c in dev_config(tmp_path / "dev.db", console_socket=tmp_path / "c.sock").connectors}
        assert set(stepped) == {"stub", "zulip", "heartbeat", "console"}
        for env in stepped.values():
            assert env[TEST_CLOCK_ENV] == str(tmp_path / "clock.sock") and env[ECHO_DELAY_ENV] == "0.05"

    @pytest.mark.parametrize(("value", "debounce_ms"), [(None, DEFAULT_DEBOUNCE_MS), ("20", 20), ("0", 0),
                                                          ("-5", DEFAULT_DEBOUNCE_MS), ("soon", DEFAULT_DEBOUNCE_MS)])
    def test_dev_debounce_ms_sets_scouts_debounce(self, tmp_path, monkeypatch, value: str | None,
                                                  debounce_ms: int) -> None:
        """A whole number of ms from 0 up is scout's debounce; anything else leaves the default."""
        if value is None:
            monkeypatch.delenv(DEBOUNCE_ENV, raising=False)
        else:
            monkeypatch.setenv(DEBOUNCE_ENV, value)
        agent, _scribe = dev_config(tmp_path / "dev.db").agents
        assert agent.name == "scout" and agent.debounce_ms == debounce_ms

    @pytest.mark.parametrize(("value", "seconds"), [(None, ECHO_DELAY_S), ("0.02", 0.02), ("0", 0.0),
                                                      ("-1", ECHO_DELAY_S), ("nan", ECHO_DELAY_S),
                                                      ("inf", ECHO_DELAY_S), ("later", ECHO_DELAY_S)])
    def test_the_stubs_echo_delay_is_a_finite_number_of_seconds_or_the_default(self, monkeypatch, value: str | None,
                                                                               seconds: float) -> None:
        if value is None:
            monkeypatch.delenv(ECHO_DELAY_ENV, raising=False)
        else:
            monkeypatch.setenv(ECHO_DELAY_ENV, value)
        assert echo_delay_s() == seconds

    async def test_wall_steps_wait_their_seconds(self, monkeypatch) -> None:
        """Without a test clock a timed step is a plain wait of its seconds."""
        monkeypatch.delenv(TEST_CLOCK_ENV, raising=False)
        loop = asyncio.get_running_loop()
        async with timed_steps() as steps:
            started = loop.time()
            await steps.after(0.05)
        assert loop.time() - started >= 0.05


class TestHeartbeatPace:
    def test_the_heartbeat_stub_never_trips_the_hosts_log_flood_guard(self) -> None:
        """Ten minutes of dev's heartbeat pushes (one `mcpl.push` line each) through the host's limiter of one
        event's lines: none is held back, so no dev run ends with a `log.suppressed` warning about its own stub
        (a push every 4 s was 15 a minute against an allowance of 10)."""
        interval = float(HEARTBEAT_DEFAULTS["HEARTBEAT_INTERVAL_S"])
        limiter = WindowLimiter(LINES_PER_WINDOW, WINDOW_S)
        pushes = [limiter.admit("mcpl.push", n * interval)[0] for n in range(int(600 / interval))]
        assert all(pushes) and limiter.drain() == []


class TestConfigBeside:
    def test_the_written_config_reads_back_as_the_config_dev_ran_with(self, tmp_path) -> None:
        """dev's config as TOML: load_config gives the same config (cwd aside, which resolve fills in), 0600."""
        config = dev_config(tmp_path / "dev.db", console_socket=tmp_path / "console.sock")
        path = config_beside(tmp_path / "dev.db")
        write_config(config, path)
        assert path.name == "dev.db.toml" and path.stat().st_mode & 0o777 == 0o600
        again = msgspec.to_builtins(load_config(path))
        expected = msgspec.to_builtins(config)
        for connector in again["connectors"] + expected["connectors"]:
            connector.pop("cwd")
        assert again == expected

    @example({"\x7f": "\x7f"})  # DEL: JSON leaves it bare, TOML refuses it bare
    @given(st.recursive(st.booleans() | st.integers(-2**63, 2**63 - 1) | st.text(),
                        lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=5), st.none() | inner, max_size=3), max_leaves=8))
    def test_any_value_is_written_as_toml_that_reads_back_the_same(self, value) -> None:
        """Strings (every code point TOML allows), numbers, lists and tables round-trip; a None member is left out."""
        def without_none(v):
            if isinstance(v, dict):
                return {k: without_none(x) for k, x in v.items() if x is not None}
            if isinstance(v, list):
                return [without_none(x) for x in v]
            return v
        assert tomllib.loads(f"v = {_toml_value(value)}\n")["v"] == without_none(value)
