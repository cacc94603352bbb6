"""`mcplhost dev`: the bundled stub connectors on the embedded defaults, with a live view.

The live view (stdout) is one line per stored item and per host event, each
with a time (HH:MM:SS), cut with an ellipsis to the terminal's width (80
columns when stdout is not a terminal) so nothing wraps. Log lines are hidden
unless asked for (`-v`); warnings and errors still appear in the view as one
line each. The stubs' settings (`STUB_*`, `HEARTBEAT_*`) come from dev's own
environment when set there, else from the defaults below: tests set them for
a short, deterministic run.
"""

from __future__ import annotations

import importlib.resources
import os
import sys
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from .config import AgentConfig, BackendConfig, Config, ConnectorConfig, StoreConfig
from .inbound.notice import reader_body
from .store import NewItem

#: The live view's width when stdout is not a terminal (a pipe, a file, a test).
PLAIN_WIDTH = 80
ELLIPSIS = "…"
#: Log levels that reach the live view even while log lines are hidden.
SHOWN_LEVELS = frozenset({"warning", "error", "critical"})
#: Host events the live view shows as words, not as log lines.
HOST_EVENTS = {"host.ready": "ready", "host.stopping": "stopping"}

STUB_DEFAULTS = {"STUB_MESSAGES": "0", "STUB_INTERVAL_S": "1.5"}
HEARTBEAT_DEFAULTS = {"HEARTBEAT_INTERVAL_S": "4"}
#: dev's one agent: scripted (no network), waking on what is addressed to it or private (AGENTS.md §9).
DEV_AGENT = AgentConfig(name="scout", wake_on=["addressed", "dm"], system_prompt="You are Scout, the dev agent.",
                        backend=BackendConfig(kind="scripted", script=["You said: {{echo}}"]))
#: What each stub stages, one line each, so nothing it does looks like a fault.
EXPLAINED = {
    "stub": "MCPL 0.5 chat; one message fakes a [source: …] header, stored escaped",
    "heartbeat": "MCPL 0.4, so legacy rules (COMPAT.md); a push every {HEARTBEAT_INTERVAL_S} s",
}


def _settings(defaults: dict[str, str]) -> dict[str, str]:
    return {key: os.environ.get(key, value) for key, value in defaults.items()}


def dev_config(db: Path) -> Config:
    python = sys.executable
    return Config(
        store=StoreConfig(path=str(db)),
        connectors=[
            ConnectorConfig(
                name="stub",
                command=[python, "-m", "mcplhost.connectors.stub"],
                env=_settings(STUB_DEFAULTS),
                grant=["channels.register", "channels.incoming", "pushEvents"],
            ),
            ConnectorConfig(
                name="heartbeat",
                command=[python, "-m", "mcplhost.connectors.heartbeatish"],
                env=_settings(HEARTBEAT_DEFAULTS),
                grant=["pushEvents"],
            ),
        ],
        agents=[DEV_AGENT],
    )


def introduction(config: Config, db: Path, *, verbose: bool) -> list[str]:
    """The lines dev prints on stderr before it starts: what runs, and what each stub stages."""
    lines = [f"mcplhost dev: database {db}; Ctrl-C stops" + ("" if verbose else "; -v shows the log")]
    for connector in config.connectors:
        explained = EXPLAINED.get(connector.name)
        if explained:
            lines.append(f"  {connector.name}: " + explained.format(**connector.env))
    lines.append("  console: each line you type here is stored as console input")
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


def describe_item(item: NewItem) -> str:
    """`where  who: body` for one stored item, the body without its source header."""
    meta = item.metadata
    source = meta.get("source") if isinstance(meta.get("source"), dict) else {}
    server = meta.get("serverId") or source.get("serverId") or "-"
    place = source.get("label") or meta.get("channelId") or ("push" if source.get("lane") == "push/event" else "")
    where = f"{server} {place}".strip()
    texts = [b.get("text", f"<{b.get('type')}>") for b in reader_body(item.content, meta)]
    who = item.participant or item.agent or "-"
    return f"{where}  {who}: " + " ".join(texts)


def describe_event(event: dict[str, Any], connectors: list[str]) -> str | None:
    """A host event or a warning as one line of the view; None for what the view leaves out."""
    name = event.get("event")
    if name == "host.ready":
        return f"ready: {', '.join(connectors)}" if connectors else "ready"
    if name in HOST_EVENTS:
        return HOST_EVENTS[name]
    if name == "agent.wake":
        items = (event.get("items") or 0) + (event.get("overflow") or 0)
        return f"wake {event.get('agent')}: {items} item{'s' if items != 1 else ''}"
    if name == "agent.turn":
        tokens = f", {event['tokens']} tokens" if event.get("tokens") else ""
        return f"turn {event.get('agent')}: {event.get('outcome')} ({event.get('seconds')} s{tokens})"
    level = event.get("level")
    if level not in SHOWN_LEVELS:
        return None
    who = f"{event['connector']}: " if event.get("connector") else ""
    detail = next((str(event[k]) for k in ("error", "reason", "detail") if event.get(k)), "")
    return f"{level}: {who}{name}" + (f" ({detail})" if detail else "")


class LiveView:
    """Writes the live view's lines to one stream, fitted to its width."""

    def __init__(self, out: TextIO, width: int, now: Callable[[], float] = time.time) -> None:
        self.out = out
        self.width = width
        self.now = now
        self.connectors: list[str] = []

    @classmethod
    def for_stream(cls, out: TextIO) -> LiveView:
        width = PLAIN_WIDTH
        if out.isatty():
            try:
                width = os.get_terminal_size(out.fileno()).columns
            except OSError:
                pass  # a tty without a size (e.g. a serial console): keep the plain width
        return cls(out, width)

    def line(self, epoch_s: float, text: str) -> None:
        self.out.write(fit(f"{clock(epoch_s)}  {printable(text)}", self.width) + "\n")
        self.out.flush()

    def items(self, items: list[NewItem]) -> None:
        """Host's on_stored hook: one line per item just committed."""
        for item in items:
            self.line(item.created_at / 1000, describe_item(item))

    def event(self, event: dict[str, Any]) -> None:
        """The log tap (logs.configure): host events and warnings as lines of the view."""
        text = describe_event(event, self.connectors)
        if text is not None:
            self.line(self.now(), text)
