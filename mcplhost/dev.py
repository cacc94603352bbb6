"""`mcplhost dev`: the bundled stub connectors on the embedded defaults, with a live view.

The live view (stdout) is one line per stored item and per host event, each
with a time (HH:MM:SS), cut with an ellipsis to the terminal's width (80
columns when stdout is not a terminal, or a terminal that reports no width)
so nothing wraps. Log lines are hidden
unless asked for (`-v`); warnings and errors still appear in the view as one
line each. The stubs' settings (`STUB_*`, `ZULIP_*`, `HEARTBEAT_*`) come from
dev's own environment when set there, else from the defaults below; so do
`STAGE_ECHO_DELAY_S` (how long a platform takes to show a publish back) and
`DEV_DEBOUNCE_MS` (scout's debounce): tests set them for a short,
deterministic run.

Test-only, the clock seam: with `MCPL_TEST_CLOCK` naming a test's stepped
clock (mcplhost/connectors/mcpl_server.py `timed_steps`), the stubs' timed
steps and the `--seconds` deadline wait on that clock instead of wall time,
so a test drives the same events in the same order without waiting them out.

What is typed on dev's stdin goes to the `console` connector
(mcplhost/connectors/console.py) through a Unix socket in a private
folder: each line is a chat message on the `console` channel, `@scout …` a
mention of scout (README.md#start-here). stdin is read on the event loop
(no thread), so nothing keeps the process alive once the host has stopped.
"""

from __future__ import annotations

import importlib.resources
import json
import math
import os
import shutil
import sys
import tempfile
import time
import unicodedata
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.abc
import msgspec

from .config import (
    DEFAULT_DEBOUNCE_MS,
    DERIVED_FIELDS,
    AgentConfig,
    BackendConfig,
    Config,
    ConnectorConfig,
    HostConfig,
    StoreConfig,
    default_host_name,
)
from .connectors.console import LINE_MAX_CHARS
from .connectors.mcpl_server import TEST_CLOCK_ENV, timed_steps
from .connectors.stage import ECHO_DELAY_ENV
from .errors import OperatorError
from .inbound.notice import reader_body
from .inbound.source import PUSH_LANE
from .logs import LINES_PER_WINDOW, WINDOW_S
from .protocol.grants import IMPLEMENTED
from .store import NewItem
from .store.files import database_files
from .store.rows import UnscopedSource

#: The live view's width when stdout is not a terminal (a pipe, a file, a test) or one with no width (0 columns).
PLAIN_WIDTH = 80
ELLIPSIS = "…"
#: Log levels that reach the live view even while log lines are hidden.
SHOWN_LEVELS = frozenset({"warning", "error", "critical"})
#: Host events the live view shows as words, not as log lines.
HOST_EVENTS = {"host.ready": "ready", "host.stopping": "stopping"}
#: On a terminal (and without NO_COLOR), each kind of line has its colour (SGR codes); item lines keep the default.
COLOURS = {"agent.wake": "33", "agent.tool_called": "36", "agent.turn": "32", "outbox.delivered": "1;34",
           "peer.delivered": "1;35",
           "speech.draft": "35", "speech.typing": "2", "agent.acknowledged": "2", "agent.stop": "1;33",
           "warning": "31", "error": "1;31", "critical": "1;31"}
RESET = "\x1b[0m"

#: The Discord-shaped stub plays its whole scenario once (STUB_MESSAGES 0: every step).
STUB_DEFAULTS = {"STUB_SCENARIO": "discord", "STUB_MESSAGES": "0", "STUB_INTERVAL_S": "1.5"}
#: The Zulip-shaped stub starts once the Discord-shaped one is done, so their lines never interleave.
ZULIP_DEFAULTS = {"ZULIP_MESSAGES": "0", "ZULIP_DELAY_S": "16", "ZULIP_INTERVAL_S": "1.5"}
#: The heartbeat stub's pace: each push is one `mcpl.push` log line, and the host writes at most LINES_PER_WINDOW
#: of one event per connector in WINDOW_S (a push every 4 s tripped that flood guard, and every dev stop then
#: showed its `log.suppressed` warning); at this pace one window holds at most LINES_PER_WINDOW - 1 of them.
HEARTBEAT_DEFAULTS = {"HEARTBEAT_INTERVAL_S": str(math.ceil(WINDOW_S / (LINES_PER_WINDOW - 1)))}
#: Passed to dev's connectors only when set in dev's environment (each connector has its own default).
PASSED_THROUGH = (ECHO_DELAY_ENV, TEST_CLOCK_ENV)
#: Scout's debounce (ms) when dev's environment sets it; a test on a stepped clock waits less for each wake.
DEBOUNCE_ENV = "DEV_DEBOUNCE_MS"
#: channels.publish only once this host implements it, so dev never grants what nothing serves.
CHAT_GRANT: list[str] = [path for path in ("channels.register", "channels.incoming", "channels.publish",
                                            "channels.typing", "channels.acknowledge") if path in IMPLEMENTED]
#: dev's one agent: scripted (no network), waking on what is addressed to it or private (README.md#start-here).
#: Its first turn calls the stub's `echo` tool once, then every reply says the waking text back.
#: The stub's token, a made-up value: a connector variable named *TOKEN* is a secret (docs/agents.md#secrets),
#: so scout's answer to Dana, which repeats it, is withheld as a draft and the token is stored nowhere.
DEV_STUB_TOKEN = "dev-token-0f1e2d3c4b5a"
#: The first line of the config dev writes beside its database: what marks a database as one dev made.
CONFIG_HEADER = "# Written by `mcplhost dev` for `mcplhost explain --config`: the config dev ran with.\n"
#: One reply per backend call, in the order the stubs' scenario makes them: the deploy question (a tool round,
#: then its answer), scribe's peer message, Dana's DM (it would post the stub's token), the two guilds'
#: mentions, Hana's report (a slow tool that Alice's `!stop` aborts), then every later call says the waking
#: text back.
DEV_SCRIPT: list[Any] = [{"text": "Let me check the stub.", "tool_calls": [
    {"name": "stub__echo", "arguments": {"text": "ping"}},
    {"name": "task_send_message", "arguments": {"target": "scribe", "message": "Someone asked about the deploy notes."}},
]}, "You said: {{echo}}", "You said: {{echo}}", f"Dana, the stub's token is {DEV_STUB_TOKEN}.",
    "You said: {{echo}}",
    {"text": "", "tool_calls": [{"name": "stub__report", "arguments": {}}]}, "You said: {{echo}}"]
#: Whose stop commands scout obeys: Alice of the stub (connector/author-id, docs/agents.md#stop).
DEV_CONTROL_FROM = ["stub/alice"]
DEV_AGENT = AgentConfig(name="scout", wake_on=["addressed", "dm"], system_prompt="You are Scout, the dev agent.",
                        ack_reaction="\N{EYES}", control_from=DEV_CONTROL_FROM,
                        backend=BackendConfig(kind="scripted", script=DEV_SCRIPT))
#: dev's second agent, scout's child in one tree (docs/peers.md): woken only by peer messages. Scout's first
#: turn sends it guidance (task_send_message); it answers scout with a peer message, which starts a turn of
#: scout's whose prose has no chat to go to (a draft).
HELPER_SCRIPT: list[Any] = [{"text": "", "tool_calls": [{"name": "task_send_message", "arguments": {
    "target": "scout", "message": "Noted: I will keep the deploy notes in mind."}}]}, ""]
HELPER_AGENT = AgentConfig(name="scribe", parent="scout", title="Scribe", wake_on=[],
                           system_prompt="You are Scribe, who keeps notes for Scout.",
                           backend=BackendConfig(kind="scripted", script=HELPER_SCRIPT))
#: What each stub stages, a line or two each, so nothing it does looks like a fault.
EXPLAINED = {
    "stub": ["MCPL 0.5, like Discord: guilds, a thread, a DM, a rename, a fake header",
             "two mentions in two guilds at once: they share no conversation, so a draft",
             "typing while scout answers, a reaction on what woke it; its answer to",
             "Dana holds the stub's token: withheld; Alice's !stop aborts a slow report"],
    "zulip": ["MCPL 0.5, like Zulip: streams, each topic a thread"],
    "heartbeat": ["MCPL 0.4, so legacy rules (docs/mcpl-compat.md); a push every {HEARTBEAT_INTERVAL_S} s"],
    "console": ["each line you type is a message; \"@scout ...\" mentions scout,",
                "who replies here; other lines are stored and wake no one"],
}
#: Lines typed before the console connector connects (or while it restarts) wait here, the oldest dropped first.
CONSOLE_BACKLOG = 100
#: Bytes read from stdin at a time (a terminal hands over at most one line per read).
READ_CHUNK = 4096


def _settings(defaults: dict[str, str]) -> dict[str, str]:
    return {**{key: os.environ.get(key, value) for key, value in defaults.items()}, **_passed()}


def _passed() -> dict[str, str]:
    return {key: os.environ[key] for key in PASSED_THROUGH if os.environ.get(key)}


def dev_agent() -> AgentConfig:
    """DEV_AGENT, with the debounce DEV_DEBOUNCE_MS gives (a whole number of ms from 0 up; else the default)."""
    text = os.environ.get(DEBOUNCE_ENV, "")
    debounce_ms = int(text) if text.isdigit() else DEFAULT_DEBOUNCE_MS
    return msgspec.structs.replace(DEV_AGENT, debounce_ms=debounce_ms)


async def clock_sleep(seconds: float) -> None:
    """Wait `seconds` on dev's clock: wall time, or the test's stepped clock (MCPL_TEST_CLOCK) as the stubs do."""
    async with timed_steps() as steps:
        await steps.after(seconds)


def dev_config(db: Path, console_socket: Path | None = None) -> Config:
    """The embedded config; with `console_socket`, also the console connector that relays what is typed."""
    python = sys.executable
    console = [ConnectorConfig(
        name="console",
        command=[python, "-m", "mcplhost.connectors.console"],
        env={"CONSOLE_SOCKET": str(console_socket), "CONSOLE_AGENTS": DEV_AGENT.name, **_passed()},
        grant=CHAT_GRANT,
    )] if console_socket is not None else []
    return Config(
        store=StoreConfig(path=str(db), state_dir=str(db.parent)),
        host=HostConfig(name=default_host_name()),  # as a file without [host] reads
        connectors=[
            ConnectorConfig(
                name="stub",
                command=[python, "-m", "mcplhost.connectors.stub"],
                env={**_settings(STUB_DEFAULTS), "STUB_TOKEN": DEV_STUB_TOKEN},
                grant=[*CHAT_GRANT, "pushEvents", "tools"],
            ),
            ConnectorConfig(
                name="zulip",
                command=[python, "-m", "mcplhost.connectors.zulipish"],
                env=_settings(ZULIP_DEFAULTS),
                grant=CHAT_GRANT,
            ),
            ConnectorConfig(
                name="heartbeat",
                command=[python, "-m", "mcplhost.connectors.heartbeatish"],
                env=_settings(HEARTBEAT_DEFAULTS),
                grant=["pushEvents"],
            ),
            *console,
        ],
        agents=[dev_agent(), HELPER_AGENT],
    )


def config_toml(config: Config) -> str:
    """The config as a TOML file `load_config` reads back to the same config: what `mcplhost explain` is given.

    Each top-level table is one line of inline tables and arrays (TOML 1.0
    allows any value there), so this writer needs no general TOML encoder.
    Derived fields (config.DERIVED_FIELDS) and the other store engine's keys are left out; `None` is left out,
    which is every optional key's default.
    """
    document = msgspec.to_builtins(config)
    for table in [document["store"], *document.get("connectors", [])]:
        for field in DERIVED_FIELDS:
            table.pop(field, None)
    # Only the chosen engine's keys: the other's, written at their defaults, would be problems (one of path and url).
    for key in ("url", "pool_size") if config.store.url is None else ("path", "synchronous"):
        document["store"].pop(key, None)
    return "".join(f"{key} = {_toml_value(value)}\n" for key, value in document.items() if value is not None)


def config_beside(db: Path) -> Path:
    """Where dev writes its config for `mcplhost explain`, which looks there first: beside the database, never it."""
    return db.with_name(db.name + ".toml")


def write_config(config: Config, path: Path) -> None:
    """`config_toml(config)` into `path`, readable by its owner only (a connector's env may hold a token)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its own mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(CONFIG_HEADER)
        out.write(config_toml(config))


def made_by_dev(db: Path) -> bool:
    """Whether an earlier dev run made the database at `db`: dev's config stands beside it (`config_beside`)."""
    try:
        with open(config_beside(db), encoding="utf-8") as config:
            return config.readline() == CONFIG_HEADER
    except (OSError, UnicodeDecodeError):
        return False


def start_fresh(db: Path) -> bool:
    """Remove what an earlier dev run left at `db` (the database, its WAL and SHM), so the stubs' scenario is
    stored, and shown, whole again instead of deduplicated against it; whether there was one. Called with the
    database's lock held. A database dev did not make is never removed: OperatorError saying what to do."""
    found = [file for file in database_files(db) if file.exists()]
    if not found:
        return False
    if not made_by_dev(db):
        raise OperatorError(f"{db}: not a database an earlier mcplhost dev made (no {config_beside(db).name} of "
                            "dev's beside it)", "dev starts from a fresh database on every run and removes only "
                            "its own: pass --db with a new file, or move that one away")
    for file in found:
        file.unlink(missing_ok=True)
    return True


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # A JSON string is a TOML basic string once DEL, which JSON leaves bare and TOML refuses, is escaped.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        pairs = (f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items() if v is not None)
        return "{" + ", ".join(pairs) + "}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def introduction(config: Config, db: Path, *, verbose: bool, replaced: bool = False) -> list[str]:
    """The lines dev prints on stderr before it starts: what runs, and what each stub stages (`replaced`: the
    last run's database was removed for this one, `start_fresh`)."""
    lines = [f"mcplhost dev: database {db}; Ctrl-C stops" + ("" if verbose else "; -v shows the log")]
    if replaced:
        lines.append("  a fresh database each run: the last run's was replaced, so it all plays again")
    for connector in config.connectors:
        first, *more = EXPLAINED.get(connector.name) or [""]
        if first:
            lines.append(f"  {connector.name}: " + first.format(**connector.env))
            lines.extend("    " + line.format(**connector.env) for line in more)
    lines.append("  agents: scout; scribe, its child, woken by peer messages (docs/peers.md)")
    lines.append("  docs: README.md, docs/connectors.md (how a connector talks to this host)")
    return lines


def bundled_connectors() -> list[str]:
    """The modules of mcplhost.connectors that run as a program (helpers such as mcpl_server do not)."""
    names = []
    for entry in importlib.resources.files("mcplhost.connectors").iterdir():
        name = entry.name.removesuffix(".py")
        if entry.name.endswith(".py") and not name.startswith("_") and 'if __name__ == "__main__":' in (
                entry.read_text(encoding="utf-8")):
            names.append(name)
    return sorted(names)


# --- the live view -------------------------------------------------------------------


def clock(epoch_s: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch_s))


def printable(text: str) -> str:
    """One line of text safe for a terminal: newlines shown as ⏎, other control characters as �."""
    out = []
    for char in text:
        if char == "\n":
            out.append(" ⏎ ")
        elif char == "\t":
            out.append(" ")
        elif unicodedata.category(char).startswith("C"):
            out.append("\N{REPLACEMENT CHARACTER}")
        else:
            out.append(char)
    return "".join(out)


def _cells(char: str) -> int:
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 0 if unicodedata.combining(char) else 1


def fit(line: str, width: int) -> str:
    """`line` cut to `width` terminal cells, ending in an ellipsis when cut."""
    if sum(_cells(c) for c in line) <= width:
        return line
    used, out = 0, []
    for char in line:
        cells = _cells(char)
        if used + cells > width - 1:
            break
        out.append(char)
        used += cells
    return "".join(out) + ELLIPSIS


def place(server: str, label: str, thread: Any) -> str:
    """`server label` (the label once when it is the server's name, as the console's is) and, in a thread,
    ` › thread`: where an item came from or a publish went."""
    where = server if label == server else f"{server} {label}".strip()
    return where + (f" › {thread}" if isinstance(thread, str) and thread else "")


def describe_item(item: NewItem) -> str:
    """`where  who: body` for one stored item, the body without its source header; an echo says so."""
    meta, source = item.meta, item.meta.source or UnscopedSource()
    server = meta.server_id or source.server_id or "-"
    label = source.label or meta.channel_id or ("push" if source.lane == PUSH_LANE else "")
    where = place(server, label, meta.thread_id or source.thread_id)
    texts = [b.get("text", f"<{b.get('type')}>") for b in reader_body(item.content, meta.source_header)]
    who = item.participant or item.agent or "-"
    return f"{where}  {who}{' (echo)' if meta.echo_of else ''}: " + " ".join(texts)


def event_place(event: dict[str, Any], labels: dict[tuple[str, str], str] | None, thread: Any) -> str:
    """Where a host event's `connector` and `channel` are, named by the label last seen on an item from there."""
    server, channel = str(event.get("connector")), str(event.get("channel"))
    return place(server, (labels or {}).get((server, channel), channel), thread)


def describe_event(event: dict[str, Any], connectors: list[str],
                   labels: dict[tuple[str, str], str] | None = None) -> str | None:
    """A host event or a warning as one line of the view; None for what the view leaves out.

    `labels` maps (connector, channel id) to the label last seen on an item, so a publish names its channel
    the way the items from it do.
    """
    name = event.get("event")
    if name == "outbox.delivered":
        return f"publish {event.get('agent')} → {event_place(event, labels, event.get('thread'))}"
    if name == "speech.draft":
        return f"draft {event.get('agent')}: {event.get('reason')}, nothing published"
    if name == "speech.typing":
        return f"typing {event.get('agent')} → {event_place(event, labels, event.get('thread'))}"
    if name == "agent.acknowledged":
        return f"ack {event.get('agent')} {event.get('representation')} → {event_place(event, labels, None)}"
    if name == "agent.stop":
        aborted = "turn aborted" if event.get("turn_aborted") else "no turn running"
        dropped = event.get("dropped") or 0
        wakes = f", {dropped} pending wake{'s' if dropped != 1 else ''} dropped" if dropped else ""
        return f"stop {event.get('agent')}: {aborted}{wakes}"
    if name == "host.ready":
        return f"ready: {', '.join(connectors)}" if connectors else "ready"
    if name in HOST_EVENTS:
        return HOST_EVENTS[name]
    if name == "agent.wake":
        items = (event.get("items") or 0) + (event.get("overflow") or 0)
        return f"wake {event.get('agent')}: {items} item{'s' if items != 1 else ''}"
    if name == "agent.tool_called":
        return f"tool {event.get('agent')}: {event.get('tool')}" + (" (error)" if event.get("error") else "")
    if name == "peer.delivered":
        how = "guidance" if event.get("relationship") == "ancestor" else f"message from a {event.get('relationship')}"
        return f"peer {event.get('sender')} → {event.get('agent')}: {how}"
    if name == "peer.send" and event.get("status") not in ("accepted", "queued"):
        reason = f" ({event['reason']})" if event.get("reason") else ""
        return f"peer {event.get('agent')} → {event.get('target')}: {event.get('status')}{reason}"
    if name == "agent.turn":
        tokens = f", {event['tokens']} tokens" if event.get("tokens") else ""
        reason = f", {event['reason']}" if event.get("reason") else ""
        return f"turn {event.get('agent')}: {event.get('outcome')}{reason} ({event.get('seconds')} s{tokens})"
    level = event.get("level")
    if level not in SHOWN_LEVELS:
        return None
    who = f"{event['connector']}: " if event.get("connector") else ""
    detail = next((str(event[k]) for k in ("error", "reason", "detail") if event.get(k)), "")
    return f"{level}: {who}{name}" + (f" ({detail})" if detail else "")


class LiveView:
    """Writes the live view's lines to one stream, fitted to its width."""

    def __init__(self, out: TextIO, width: int, now: Callable[[], float] = time.time, *, colour: bool = False) -> None:
        self.out = out
        self.width = width
        self.colour = colour
        self.now = now
        self.connectors: list[str] = []
        self.labels: dict[tuple[str, str], str] = {}
        #: Each agent's latest wake, by its first item id: what a draft's explain hint names.
        self.woken_by: dict[str, int] = {}
        self.database: str | None = None  # as the operator named it: the explain hint's --db

    @classmethod
    def for_stream(cls, out: TextIO) -> LiveView:
        width = PLAIN_WIDTH
        tty = out.isatty()
        if tty:
            try:
                # A fresh pty or a serial console reports 0 columns: that is no size, not a width of 0.
                width = os.get_terminal_size(out.fileno()).columns or PLAIN_WIDTH
            except OSError:
                pass  # a tty without a size: keep the plain width
        return cls(out, width, colour=tty and not os.environ.get("NO_COLOR"))

    def line(self, epoch_s: float, text: str, kind: str | None = None) -> None:
        """One timed line, fitted first (escape codes take no cells), then coloured by `kind` on a terminal."""
        fitted = fit(f"{clock(epoch_s)}  {printable(text)}", self.width)
        code = COLOURS.get(kind or "") if self.colour else None
        self.out.write((f"\x1b[{code}m{fitted}{RESET}" if code else fitted) + "\n")
        self.out.flush()

    def items(self, items: list[NewItem]) -> None:
        """Host's on_stored hook: one line per item just committed."""
        for item in items:
            meta = item.meta
            if meta.source is not None and meta.source.label and meta.channel_id:
                self.labels[(str(meta.server_id), meta.channel_id)] = meta.source.label
            self.line(item.created_at / 1000, describe_item(item))

    def event(self, event: dict[str, Any]) -> None:
        """The log tap (logs.configure): host events and warnings as lines of the view."""
        name = str(event.get("event"))
        if name == "agent.wake" and isinstance(event.get("first_item"), int):
            self.woken_by[str(event.get("agent"))] = event["first_item"]
        text = describe_event(event, self.connectors, self.labels)
        if text is not None:
            self.line(self.now(), text, name if name in COLOURS else str(event.get("level")))
        item = self.woken_by.get(str(event.get("agent")))
        if name == "speech.draft" and item is not None:  # one hint per draft: where to read why
            database = f" --db {self.database}" if self.database else ""  # explain finds dev's config beside it
            self.line(self.now(), f"  why: mcplhost explain {item}{database}", name)


# --- the console -------------------------------------------------------------------


class LineSplitter:
    """Bytes read from the terminal in, whole typed lines out, each at most LINE_MAX_CHARS characters.

    What is held back waiting for its newline is bounded too: past the bound
    the line is cut there and the rest of it, up to its newline, dropped.
    """

    def __init__(self, max_chars: int = LINE_MAX_CHARS) -> None:
        self.max_bytes = max_chars * 4  # UTF-8 takes at most 4 bytes a character
        self.max_chars = max_chars
        self.pending = bytearray()
        self.skipping = False  # inside a line already cut: drop up to its newline

    def feed(self, data: bytes) -> list[str]:
        lines = []
        *ended, rest = data.split(b"\n")
        for part in ended:
            self._hold(part)
            if not self.skipping:
                lines.append(self._take())
            self.skipping = False
        self._hold(rest)
        if len(self.pending) > self.max_bytes:
            lines.append(self._take())
            self.skipping = True
        return lines

    def _hold(self, part: bytes) -> None:
        if not self.skipping:
            self.pending += part[: self.max_bytes + 1 - len(self.pending)]

    def end(self) -> list[str]:
        """At the end of input: the last line, when it had no newline."""
        return [self._take()] if self.pending and not self.skipping else []

    def _take(self) -> str:
        text = self.pending.decode("utf-8", "replace")[: self.max_chars].rstrip("\r")
        self.pending.clear()
        return text


async def typed_lines(fd: int) -> AsyncIterator[str]:
    """The lines typed on `fd`, read on the event loop: no thread is left blocked in a read at exit.

    A file the loop cannot wait on (a regular file, /dev/null) is always
    ready, so it is read straight away; a closed or unusable fd yields nothing.
    """
    splitter = LineSplitter()
    pollable = True
    while True:
        if pollable:
            try:
                await anyio.wait_readable(fd)
            except PermissionError:
                pollable = False  # epoll refuses files that never block
            except OSError:
                return
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            continue
        except OSError:
            return
        if not data:
            for line in splitter.end():
                yield line
            return
        for line in splitter.feed(data):
            yield line
        if not pollable:
            await anyio.sleep(0)  # a long file must not hold the loop


class ConsoleRelay:
    """Relays the lines typed on dev's stdin to the console connector over a Unix socket.

    The socket lives in a folder of its own (mode 0700), removed on exit.
    Lines typed while no connector is connected wait in a bounded backlog.
    """

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="mcplhost-dev-"))
        self.path = self.folder / "console.sock"
        self.clients: list[anyio.abc.SocketStream] = []
        self.backlog: deque[bytes] = deque(maxlen=CONSOLE_BACKLOG)
        self.listener: anyio.abc.SocketListener | None = None

    def __enter__(self) -> ConsoleRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    async def run(self) -> None:
        """Relay stdin (when there is one) until cancelled."""
        async with await anyio.create_unix_listener(self.path) as listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, self._connected)
            if sys.stdin is not None:  # None when dev was started with stdin closed
                async for line in typed_lines(sys.stdin.fileno()):
                    if line.strip():
                        await self._send((line + "\n").encode())
            await anyio.sleep_forever()  # stdin ended; the connector stays up until the host stops

    async def _connected(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            while self.backlog:
                await client.send(self.backlog.popleft())
            self.clients.append(client)
            try:
                while True:
                    await client.receive()  # the connector sends nothing: this waits for it to go away
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            finally:
                self.clients.remove(client)

    async def _send(self, data: bytes) -> None:
        if not self.clients:
            self.backlog.append(data)
        for client in list(self.clients):
            try:
                await client.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.backlog.append(data)  # a connector that restarts gets it on its next connection
