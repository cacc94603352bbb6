"""The `mcplhost` command (docs/architecture.md). The only place operator errors become one stderr line.

Exit status: 0 done (also when the reader of stdout went away, as with
`| head`); 1 an operator error, one line on stderr saying what is wrong
(e.g. the database is in use by another daemon); 2 a usage or config error
(a bad option, a config file with problems). Problems, errors and warnings go
to stderr; results go to stdout.

A few commands import what only they need inside their function (`dev`'s
live view, the readers of `search`, `turns` and `outbox`), so every other
command starts without loading them; none of those imports dodges a cycle
(the layers, docs/architecture.md#layers, are checked by lint-imports).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import select
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

import anyio
import msgspec
import structlog

from . import __version__, logs
from .config import (
    Config,
    ConfigMissing,
    control_socket_path,
    database_path_problems,
    default_config_path,
    read_config,
)
from .control.client import NoDaemon, ask
from .control.status import Status, render_table
from .control.wire import Request, RestartRequest, StatusRequest
from .errors import ConfigError, OperatorError
from .hardening import refuse_inspection_by_same_user
from .host import open_host
from .lock import hold_database
from .protocol.grants import unknown_grant_problem
from .store import open_reader, open_store
from .store.items import NewItem, StoredItem, export_line
from .supervisor.children import recording_children
from .systemd import Notifier, watchdog_interval_s

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

#: SQLite's largest integer: a --limit past it would overflow the driver instead of meaning "all".
MAX_COUNT = 2**63 - 1
#: --seconds past a year is a typo, and a timer that far out overflows the event loop's clock.
MAX_SECONDS = 366 * 24 * 3600.0
#: How long `mcplhost search` may take by default (--timeout): longer than an agent's search (an operator waits
#: for a whole table), still bounded; it then prints what it found and says where it stopped.
CLI_SEARCH_DEADLINE_S = 60.0
#: `mcplhost dev`'s database when --db is not given, in the current folder.
DEV_DB = "mcplhost-dev.db"
#: How often `messages --follow` looks for new items (each look is one short read; no lock).
FOLLOW_POLL_S = 0.2
#: A relative --since (`10m`) looks back at most this far: further is a typo, and past the epoch.
MAX_SINCE_AGO_MS = 100 * 366 * 24 * 3600 * 1000
#: Epoch-ms --since values have at most this many digits (year 2286 has 13; more is seconds times 1000 twice).
EPOCH_MS_MAX_DIGITS = 13

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SINCE_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_RELATIVE_SINCE = re.compile(r"([0-9]{1,9})([smhd])")
_ISO_SINCE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,6}))?)?Z")
SINCE_FORMS = "an ISO 8601 UTC time (2026-12-01T10:00:00Z), epoch milliseconds (1796119200000) or a time ago (10m, 2h, 3d)"

EPILOG = ("exit status: 0 done; 1 an operator error (one line on stderr); 2 a usage or config error. "
          "Problems and warnings go to stderr, results to stdout.")
LOCK_EPILOG = (EPILOG + " One daemon per database: run, dev and migrate hold a lock on DATABASE.lock beside it; "
               "a second one exits 1 with one line naming the holder's pid (messages, search, turns and outbox need no lock).")


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are ONE line on stderr (exit 2) instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def count(text: str) -> int:
    """An argparse type: a whole number from 0 to MAX_COUNT."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_COUNT}, not {text}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds from 0 to MAX_SECONDS (no nan, no inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be a number of seconds from 0 to {MAX_SECONDS:.0f}, not {text}")
    return value


def parse_since(text: str, now_ms: int) -> int:
    """--since TIME as epoch ms; ValueError saying what is accepted for anything else (docs/operations.md#following).

    `YYYY-MM-DDTHH:MM[:SS[.ffffff]]Z` (UTC only: a time without Z or with
    another offset is refused rather than guessed), a whole number of epoch
    milliseconds, or `N` followed by s, m, h or d: that long before `now_ms`.
    """
    if (relative := _RELATIVE_SINCE.fullmatch(text)) is not None:
        ago = int(relative[1]) * SINCE_UNITS_MS[relative[2]]
        if ago > MAX_SINCE_AGO_MS:
            raise ValueError(f"{text!r} is more than 100 years ago")
        return now_ms - ago
    if text.isascii() and text.isdigit():
        if len(text) > EPOCH_MS_MAX_DIGITS:
            raise ValueError(f"{text!r} has more than {EPOCH_MS_MAX_DIGITS} digits for epoch milliseconds")
        return int(text)
    if (iso := _ISO_SINCE.fullmatch(text)) is not None:
        year, month, day, hour, minute = (int(iso[n]) for n in range(1, 6))
        second, fraction = int(iso[6] or 0), (iso[7] or "").ljust(6, "0")
        try:
            moment = datetime(year, month, day, hour, minute, second, int(fraction), tzinfo=UTC)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a real time ({exc})") from None
        return (moment - _EPOCH) // timedelta(milliseconds=1)  # exact integer arithmetic, no float
    raise ValueError(f"not a time: {text!r}; give {SINCE_FORMS}")


def since_option(text: str) -> int:
    """An argparse type: --since TIME as epoch ms (`parse_since` against the clock now)."""
    try:
        return parse_since(text, int(time.time() * 1000))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def path_option(text: str) -> Path:
    """An argparse type: a non-empty path (Path("") would quietly mean the current folder)."""
    if not text:
        raise argparse.ArgumentTypeError("empty path")
    return Path(text)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mcplhost", description="A long-running host for MCPL connectors.", epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"mcplhost {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon in the foreground", epilog=LOCK_EPILOG)
    run.add_argument("--config", type=path_option, default=None,
                     help="config file (default: $MCPLHOST_CONFIG, then ./mcplhost.toml)")
    run.add_argument("--log-format", choices=["json", "console"], default="json",
                     help="structured JSON lines (default) or a console rendering for people")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    dev = sub.add_parser("dev", help="run the bundled stub connectors and show live activity",
                         epilog=LOCK_EPILOG)
    dev.add_argument("--seconds", type=seconds, default=None, help="stop after this many seconds")
    dev.add_argument("--db", type=path_option, default=Path(DEV_DB), help=f"SQLite file (default: ./{DEV_DB})")
    dev.add_argument("-v", "--verbose", action="store_true", help="also show the log lines on stderr (hidden "
                     "by default; giving --log-format or --log-level shows them too)")
    dev.add_argument("--log-format", choices=["json", "console"], default=None,
                     help="how shown log lines look: console (default) or json")
    dev.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"],
                     help="the least level of shown log lines (default: info)")

    check = sub.add_parser("check-config", help="validate a config file (problems and warnings on stderr)",
                           epilog="exit status: 0 valid (warnings may be printed); 2 problems, one per line "
                                  "on stderr as 'path.to.field: what is wrong'; warnings are printed as "
                                  "'warning: path.to.field: ...'.")
    check.add_argument("path", type=path_option)

    messages = sub.add_parser("messages", help="print stored items, oldest first", epilog=EPILOG)
    messages.add_argument("--db", type=path_option, required=True)
    messages.add_argument("--json", action="store_true", help="one JSON object per line")
    messages.add_argument("--limit", type=count, default=None, help="only the newest N items")
    messages.add_argument("--channel", default=None, help="only items of this channel id")
    messages.add_argument("--agent", default=None, help="only items belonging to this agent")
    messages.add_argument("--since", type=since_option, default=None, metavar="TIME",
                          help=f"only items created at or after TIME: {SINCE_FORMS}")
    messages.add_argument("--follow", "-f", action="store_true",
                          help="then keep printing new items as they are committed, until Ctrl-C "
                               "or the reader of stdout goes away")

    backup = sub.add_parser("backup", help="copy the database with SQLite's online backup (safe while the daemon "
                                           "runs)",
                            epilog="exit status: 0 copied and checked; 1 the copy failed (one line on stderr); "
                                   "2 a usage error, also when OUT exists: a backup never overwrites.")
    backup.add_argument("--db", type=path_option, required=True)
    backup.add_argument("out", type=path_option, metavar="OUT", help="the new file; it must not exist")

    search = sub.add_parser("search", help="search stored item bodies (the source header is not searched)",
                            epilog=EPILOG)
    search.add_argument("--db", type=path_option, required=True)
    search.add_argument("query")
    search.add_argument("--regex", action="store_true", help="QUERY is a regular expression")
    search.add_argument("--ignore-case", "-i", action="store_true")
    search.add_argument("--limit", type=count, default=50, help="at most this many hits (newest first)")
    search.add_argument("--timeout", type=seconds, default=CLI_SEARCH_DEADLINE_S, metavar="SECONDS",
                        help="stop after this long with the hits found so far (default %(default)g)")
    search.add_argument("--json", action="store_true")

    turns = sub.add_parser("turns", help="print agent turns, oldest first (why each woke, how it ended)",
                           epilog=EPILOG)
    turns.add_argument("--db", type=path_option, required=True)
    turns.add_argument("--json", action="store_true", help="one JSON object per line")
    turns.add_argument("--agent", default=None, help="only this agent's turns")
    turns.add_argument("--limit", type=count, default=None, help="only the newest N turns")

    explain = sub.add_parser("explain", help="per agent, why an item did or did not wake it, and what came of it",
                             epilog="exit status: 0 done; 1 no item has that id (one line); 2 an unknown --agent "
                                    "or a usage or config error.")
    explain.add_argument("item_id", type=count, metavar="ITEM_ID")
    explain.add_argument("--db", type=path_option, required=True)
    explain.add_argument("--config", type=path_option, default=None,
                         help="config file (default: $MCPLHOST_CONFIG, then ./mcplhost.toml): the rules recomputed")
    explain.add_argument("--agent", default=None, help="only this agent")
    explain.add_argument("--json", action="store_true", help="one JSON object per agent, one a line")

    outbox = sub.add_parser("outbox", help="print publishes and their fate, oldest first", epilog=EPILOG)
    outbox.add_argument("--db", type=path_option, required=True)
    outbox.add_argument("--json", action="store_true", help="one JSON object per line")
    outbox.add_argument("--state", choices=("pending", "delivered", "failed"), default=None,
                        help="only the publishes in this state")

    status_epilog = ("exit status: 0 done (with --check: healthy, nothing printed); 1 with --check: one line per "
                     "problem on stdout, each beginning with its connector's name and a colon (with --json the "
                     "object is printed and the problem lines go to stderr), or the daemon refused; 2 no daemon "
                     "answers on the control socket (one line on stderr), or a usage or config error.")
    status = sub.add_parser("status", help="ask the running daemon how its connectors and agents are",
                            epilog=status_epilog)
    status.add_argument("--config", type=path_option, default=None,
                        help="config file (default: $MCPLHOST_CONFIG, then ./mcplhost.toml): where the socket is")
    status.add_argument("--json", action="store_true", help="the status object as JSON")
    status.add_argument("--check", action="store_true", help="a health check: exit 0 healthy, 1 problems, 2 no daemon")

    restart = sub.add_parser("restart-connector", help="restart one connector of the running daemon, with a "
                             "fresh restart budget", epilog="exit status: 0 restarting; 1 the daemon refused (no "
                             "such connector, or it stopped for good), one line on stderr; 2 no daemon answers, "
                             "or a usage or config error.")
    restart.add_argument("name", help="the connector's configured name")
    restart.add_argument("--config", type=path_option, default=None,
                         help="config file (default: $MCPLHOST_CONFIG, then ./mcplhost.toml): where the socket is")

    migrate = sub.add_parser("migrate", help="apply pending database migrations", epilog=LOCK_EPILOG)
    migrate.add_argument("--db", type=path_option, required=True)

    connector = sub.add_parser("connector", help="run a bundled connector with this mcplhost's own Python",
                               description="Runs `python -m mcplhost.connectors.NAME ARGS` with the interpreter "
                                           "mcplhost is installed in, so a config needs no python on PATH: "
                                           'command = ["/opt/mcplhost/bin/mcplhost", "connector", "stub"].')
    connector.add_argument("--list", action="store_true", help="print the bundled connectors' names")
    connector.add_argument("name", nargs="?", help="a bundled connector (see --list)")
    connector.add_argument("args", nargs=argparse.REMAINDER, help="passed to the connector (e.g. --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not hasattr(args, "log_format"):
        # Offline commands print their output on stdout; their few log lines go to stderr.
        logs.configure("console")
    try:
        try:
            return COMMANDS[args.command](args)
        finally:
            logs.shutdown()  # the queued log lines (the last being "stopped") go out before any line below
    except ConfigError as exc:
        detail = "; ".join(exc.problems) if exc.problems else exc.explanation
        print(f"mcplhost: {exc.message}" + (f": {detail}" if detail else ""), file=sys.stderr)
        return EXIT_USAGE
    except OperatorError as exc:
        print(f"mcplhost: {exc.message}" + (f" ({exc.explanation})" if exc.explanation else ""), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        return reader_gone()


def reader_gone() -> int:
    """The reader of stdout went away (`mcplhost messages | head -1`): that is a normal end, exit 0.

    stdout is pointed at /dev/null so the interpreter's final flush does not
    report the same broken pipe again.
    """
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def usable_database(path: Path) -> Path:
    """`path` if a daemon may create or open its database there; else the OperatorError saying why not."""
    for why in database_path_problems(path):
        raise OperatorError(why if str(path) in why else f"{path}: {why}")
    return path


def existing_database(path: Path) -> Path:
    """For readers: a directory is named as one, not reported as "no such database"."""
    if path.is_dir():
        raise OperatorError(f"{path}: is a directory, not a database file",
                            "pass the database file itself, e.g. --db /var/lib/mcplhost/mcplhost.db")
    return path


# --- run / dev -----------------------------------------------------------------


async def _serve(config: Config, *, notifier: Notifier | None = None,
                 on_stored: Callable[[list[NewItem]], None] | None = None, seconds: float | None = None,
                 console: Callable[[], Awaitable[None]] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
                 reread: Callable[[], Config] | None = None) -> None:
    """Build the host and run it until SIGTERM/SIGINT (or `seconds` of `sleep`, dev's clock), then stop it
    gracefully. SIGHUP reads the config again with `reread` and applies it (docs/operations.md#reload)."""
    stop = anyio.Event()
    watchdog = watchdog_interval_s()
    host: Any = None

    async def watch_signals() -> None:
        # SIGHUP is caught so that it never kills the daemon without its graceful stop.
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    await reload(host)
                    continue
                structlog.get_logger().info("host.signal", signal=signal.Signals(signum).name)
                stop.set()
                return

    async def reload(running: Any) -> None:
        """Validate the file again first: an invalid one changes nothing, and each of its problems is logged."""
        logger = structlog.get_logger()
        if reread is None or running is None:
            logger.warning("host.reload_unsupported", signal="SIGHUP", detail="this host has no config file to read")
            return
        try:
            new = reread()
        except ConfigError as exc:
            logger.warning("host.reload_refused", error=str(exc), problems=exc.problems,
                           detail="the new config is not valid; the running config stays")
            return
        await running.reload(new)

    async def stop_after(delay: float) -> None:
        await sleep(delay)
        stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_signals)
        if seconds is not None:
            tg.start_soon(stop_after, seconds)
        if console is not None:  # dev's console relay (dev.ConsoleRelay), cancelled with the rest
            tg.start_soon(console)
        async with open_host(config, notifier=notifier, on_stored=on_stored) as opened:
            host = opened
            await opened.run(stop, watchdog_s=watchdog)
        tg.cancel_scope.cancel()


def _run_host(config: Config, *, notifier: Notifier | None = None,
              on_stored: Callable[[list[NewItem]], None] | None = None, seconds: float | None = None,
              console: Callable[[], Awaitable[None]] | None = None,
              sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
              reread: Callable[[], Config] | None = None) -> None:
    """Run `_serve`; an operator error raised inside its task groups comes out as itself.

    Task groups wrap what their tasks raise in an ExceptionGroup; a store that
    cannot be opened must still reach `main` as the one-line StoreError.
    """
    try:
        anyio.run(lambda: _serve(config, notifier=notifier, on_stored=on_stored, seconds=seconds, console=console,
                                 sleep=sleep, reread=reread))
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        if len(leaves) == 1 and isinstance(leaves[0], OperatorError):
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[Any]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def _run_config(given: Path | None) -> Config:
    """The config `run` uses; a missing file says where it was looked for and how to point elsewhere."""
    path = given or default_config_path()
    try:
        return read_config(path, start_problems=False, unknown_grant=unknown_grant_problem)[0]
    except ConfigMissing as exc:
        if given is not None:
            raise
        origin = "from MCPLHOST_CONFIG" if os.environ.get("MCPLHOST_CONFIG") else "the default"
        raise ConfigError(exc.message, f"{origin}; pass --config PATH or set MCPLHOST_CONFIG") from None


def cmd_run(args: argparse.Namespace) -> int:
    logs.configure(args.log_format, args.log_level)
    config = _run_config(args.config)
    if not refuse_inspection_by_same_user():  # before any child: none may read our environment (api keys)
        structlog.get_logger().warning("host.inspectable", detail="could not mark the daemon non-dumpable: a "
                                       "connector running as the same user can read /proc/<pid>/environ")
    with hold_database(Path(config.store.path)) as lock, recording_children(lock):
        notifier = Notifier.from_environment(structlog.get_logger())
        try:
            _run_host(config, notifier=notifier, reread=lambda: _run_config(args.config))
        finally:
            notifier.close()
    return EXIT_OK


def cmd_dev(args: argparse.Namespace) -> int:
    from .dev import ConsoleRelay, LiveView, clock_sleep, config_beside, dev_config, fit, introduction, write_config

    view = LiveView.for_stream(sys.stdout)
    shown = args.verbose or args.log_format is not None or args.log_level is not None
    logs.configure(args.log_format or "console", args.log_level or "info", tap=view.event, show=shown)
    db = usable_database(args.db)
    view.database = str(db)
    with hold_database(db.resolve()) as lock, recording_children(lock), ConsoleRelay() as relay:
        config = dev_config(db.resolve(), console_socket=relay.path)
        write_config(config, config_beside(db))
        view.connectors = [c.name for c in config.connectors]
        width = LiveView.for_stream(sys.stderr).width
        for line in introduction(config, db, verbose=shown):
            print(fit(line, width), file=sys.stderr)
        _run_host(config, on_stored=view.items, seconds=args.seconds, console=relay.run, sleep=clock_sleep)
    logs.shutdown()  # the log lines first, then the last word
    print(f"mcplhost dev: stopped; read it with: mcplhost messages --db {db}", file=sys.stderr)  # not cut: copied
    return EXIT_OK


# --- offline commands ----------------------------------------------------------------


def cmd_check_config(args: argparse.Namespace) -> int:
    """Problems and warnings on stderr (as `run` prints them), the verdict on stdout."""
    try:
        config, warnings = read_config(args.path, unknown_grant=unknown_grant_problem)
    except ConfigError as exc:
        for problem in exc.problems or [exc.message + (f" ({exc.explanation})" if exc.explanation else "")]:
            print(problem, file=sys.stderr)
        return EXIT_USAGE
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"ok: {len(config.connectors)} connector(s), {len(config.agents)} agent(s)"
          + (f", {len(warnings)} warning(s)" if warnings else ""))
    return EXIT_OK


def _console_line(item: StoredItem) -> str:
    texts = [b.get("text", f"<{b.get('type')}>") for b in item.content]
    body = " ".join(t.replace("\n", " ⏎ ") for t in texts)
    who = item.participant or item.agent or "-"
    return f"{item.id:>6}  {item.role:<9} {who:<16} {body}"


def _print_rows(args: argparse.Namespace, rows: Callable[[Any], AsyncIterator[Any]],
                json_line: Callable[[Any], bytes], plain_line: Callable[[Any], str]) -> int:
    """The read-only listings (messages, turns, outbox): each row of `rows(store)` as one JSON or plain line."""

    async def main() -> None:
        async with open_reader(existing_database(args.db)) as store:
            out = sys.stdout.buffer
            async for row in rows(store):
                out.write(json_line(row) + b"\n" if args.json else (plain_line(row) + "\n").encode())
            out.flush()

    anyio.run(main)
    return EXIT_OK


def cmd_messages(args: argparse.Namespace) -> int:
    if args.follow:
        return _follow_messages(args)
    return _print_rows(args, lambda store: store.items.iterate(limit=args.limit, channel=args.channel,
                                                               agent=args.agent, since_ms=args.since),
                       export_line, _console_line)


def _follow_messages(args: argparse.Namespace) -> int:
    """`messages --follow`: what `messages` prints, then every FOLLOW_POLL_S the items committed since.

    Each poll is one read of ids above the last printed (a reader sees the
    last commit, takes no lock and holds up no commit). Ends with exit 0 on
    Ctrl-C (main) or when the reader of stdout went away: a write fails, or
    a poll finds the pipe's reading end closed while there is nothing to write.
    """

    async def main() -> None:
        async with open_reader(existing_database(args.db)) as store:
            out = sys.stdout.buffer
            last, limit = 0, args.limit
            while True:
                # Every id up to `newest` is looked at by this poll (its listing reads the newest id after this),
                # so the next poll starts past it even where no item matched the filters.
                newest = await store.items.last_id()
                async for item in store.items.iterate(limit=limit, channel=args.channel, agent=args.agent,
                                                      since_ms=args.since, after_id=last):
                    out.write(export_line(item) + b"\n" if args.json else (_console_line(item) + "\n").encode())
                    last = item.id
                out.flush()
                limit = None  # --limit bounds the first listing only
                last = max(last, newest)
                if _reader_closed(out):
                    raise BrokenPipeError
                await anyio.sleep(FOLLOW_POLL_S)

    anyio.run(main)
    return EXIT_OK


def _reader_closed(out: Any) -> bool:
    """True when stdout is a pipe or socket whose reading end is closed (poll reports an error or hang-up)."""
    try:
        poller = select.poll()
        poller.register(out.fileno(), 0)  # POLLERR and POLLHUP are always reported
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no descriptor (a captured stdout): only a failed write tells
        return False


def cmd_backup(args: argparse.Namespace) -> int:
    from .store.backup import BackupExists, backup

    try:
        done = backup(existing_database(args.db), args.out)
    except BackupExists as exc:
        print(f"mcplhost: {exc.message} ({exc.explanation})", file=sys.stderr)
        return EXIT_USAGE
    print(f"backed up {args.db} to {done.path}: {done.pages} pages, {done.bytes} bytes, integrity_check ok")
    return EXIT_OK


def cmd_search(args: argparse.Namespace) -> int:
    from .store.readers import SearchError, SearchResult, search_items, stopped_early_warning, timed_out_warning

    async def main() -> SearchResult:
        async with open_reader(existing_database(args.db)) as store:
            return await search_items(store, args.query, as_regex=args.regex, ignore_case=args.ignore_case,
                                      limit=args.limit, deadline_s=args.timeout)

    try:
        found = anyio.run(main)
    except SearchError as exc:
        print(f"mcplhost: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for hit in found.hits:
        if args.json:
            sys.stdout.buffer.write(msgspec.json.encode(hit) + b"\n")
        else:
            print(f"{hit['id']:>6}  {hit.get('channelId') or '-':<24} {hit['snippet']}")
    sys.stdout.flush()
    # What could not be searched is said, never dropped silently; the exit stays 0.
    for warning in (timed_out_warning(found), stopped_early_warning(found, args.timeout)):
        if warning is not None:
            print(f"mcplhost: {warning}", file=sys.stderr)
    return EXIT_OK


def cmd_turns(args: argparse.Namespace) -> int:
    from .store import turn_line
    from .store.readers import turn_plain_line, turns_with_triggers

    if args.json:  # the export's keys only (README.md#commands): the waking ids say what woke each turn
        return _print_rows(args, lambda store: store.turns.iterate(agent=args.agent, limit=args.limit),
                           turn_line, turn_plain_line)
    return _print_rows(args, lambda store: turns_with_triggers(store, agent=args.agent, limit=args.limit),
                       lambda pair: turn_line(pair[0]), lambda pair: turn_plain_line(*pair))


def cmd_outbox(args: argparse.Namespace) -> int:
    from .store.outbox import outbox_line
    from .store.readers import outbox_plain_line

    return _print_rows(args, lambda store: store.outbox.iterate(state=args.state), outbox_line, outbox_plain_line)


def cmd_explain(args: argparse.Namespace) -> int:
    """Per agent (config order), why the item did or did not wake it (docs/agents.md#explain)."""
    from .agents.explain import explain_item, explanation_line, plain_lines
    from .dev import config_beside

    # The config `mcplhost dev` wrote beside its database comes before the environment's and ./mcplhost.toml:
    # it is the one that database was written with (README.md#deviations-and-decisions).
    beside = config_beside(Path(args.db))
    agents = _run_config(args.config or (beside if beside.is_file() else None)).agents
    if args.agent is not None:
        agents = [agent for agent in agents if agent.name == args.agent]
        if not agents:
            raise ConfigError(f"no agent named {args.agent!r} in the config")

    async def main() -> list[Any] | None:
        async with open_reader(existing_database(args.db)) as store:
            return await explain_item(store, agents, args.item_id)

    answers = anyio.run(main)
    if answers is None:
        raise OperatorError(f"no item {args.item_id} in {args.db}")
    out = sys.stdout.buffer
    for answer in answers:
        out.write(explanation_line(answer) + b"\n" if args.json else "".join(
            line + "\n" for line in plain_lines(answer)).encode())
    out.flush()
    return EXIT_OK


# --- the control socket ------------------------------------------------------------------


class DaemonRefused(OperatorError):
    """The daemon answered, and refused the request."""


def _ask_daemon(args: argparse.Namespace, request: Request) -> Any:
    """The daemon's answer; no daemon answering is one stderr line and exit 2 (the caller returns it)."""
    path = control_socket_path(_run_config(args.config))
    try:
        answer = anyio.run(ask, path, request)
    except NoDaemon as exc:
        print(f"mcplhost: {exc}", file=sys.stderr)
        return None
    if not answer.ok:
        raise DaemonRefused(answer.error or "the daemon refused the request")
    return answer


def cmd_status(args: argparse.Namespace) -> int:
    answer = _ask_daemon(args, StatusRequest())
    if answer is None:
        return EXIT_USAGE
    if not isinstance(answer.status, msgspec.Raw):
        raise DaemonRefused("the daemon's answer holds no status object")
    problems = answer.problems
    if args.json:
        sys.stdout.buffer.write(bytes(answer.status) + b"\n")
        sys.stdout.flush()
    elif not args.check:
        for line in render_table(msgspec.json.decode(bytes(answer.status), type=Status)):
            print(line)
    if not args.check:
        return EXIT_OK
    for problem in problems:
        print(problem, file=sys.stderr if args.json else sys.stdout)
    return EXIT_ERROR if problems else EXIT_OK


def cmd_restart_connector(args: argparse.Namespace) -> int:
    if _ask_daemon(args, RestartRequest(name=args.name)) is None:
        return EXIT_USAGE
    print(f"{args.name}: restarting now, with a fresh restart budget")
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    """Takes the database's lock like `run`: migrating under a running daemon is refused."""
    db = usable_database(args.db)

    async def main() -> list[int]:
        async with open_store(db, migrate=False) as store:
            return await store.migrate()

    with hold_database(db):
        applied = anyio.run(main)
    print(f"applied {len(applied)} migration(s)" + (f": {', '.join(map(str, applied))}" if applied else ""))
    return EXIT_OK


def cmd_connector(args: argparse.Namespace) -> int:
    """Replace this process with `python -m mcplhost.connectors.NAME ARGS` (same pid, so signals reach it)."""
    from .dev import bundled_connectors

    names = bundled_connectors()
    if args.list:
        print("\n".join(names))
        return EXIT_OK
    if args.name is None:
        raise ConfigError("connector: name a bundled connector", f"one of: {', '.join(names)}")
    if args.name not in names:
        raise ConfigError(f"connector: no bundled connector is named {args.name!r}", f"one of: {', '.join(names)}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", f"mcplhost.connectors.{args.name}", *args.args])


COMMANDS = {
    "run": cmd_run,
    "dev": cmd_dev,
    "check-config": cmd_check_config,
    "messages": cmd_messages,
    "search": cmd_search,
    "turns": cmd_turns,
    "outbox": cmd_outbox,
    "explain": cmd_explain,
    "status": cmd_status,
    "restart-connector": cmd_restart_connector,
    "migrate": cmd_migrate,
    "backup": cmd_backup,
    "connector": cmd_connector,
}


if __name__ == "__main__":
    sys.exit(main())
