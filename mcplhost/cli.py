"""The `mcplhost` command (INTERFACES.md). The only place operator errors become one stderr line."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog

from . import __version__, logs
from .config import default_config_path, load_config
from .errors import ConfigError, OperatorError
from .host import Host
from .store import open_reader, open_store
from .store.items import StoredItem, export_line
from .systemd import Notifier, watchdog_interval_s

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def count(text: str) -> int:
    """An argparse type: a whole number, 0 or more (a negative --limit is a usage error, not a traceback)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcplhost", description="A long-running host for MCPL connectors.")
    parser.add_argument("--version", action="version", version=f"mcplhost {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def logging_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--log-format", choices=["json", "console"], default="json",
                       help="structured JSON lines (default) or a console rendering for people")
        p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    run = sub.add_parser("run", help="run the daemon in the foreground")
    run.add_argument("--config", type=Path, default=None,
                     help="config file (default: $MCPLHOST_CONFIG, then ./mcplhost.toml)")
    logging_options(run)

    dev = sub.add_parser("dev", help="run the bundled stub connectors and show live activity")
    dev.add_argument("--seconds", type=float, default=None, help="stop after this many seconds")
    dev.add_argument("--db", type=Path, default=Path("mcplhost-dev.db"), help="SQLite file (default: ./mcplhost-dev.db)")
    logging_options(dev)

    check = sub.add_parser("check-config", help="validate a config file")
    check.add_argument("path", type=Path)

    messages = sub.add_parser("messages", help="print stored items, oldest first")
    messages.add_argument("--db", type=Path, required=True)
    messages.add_argument("--json", action="store_true", help="one JSON object per line")
    messages.add_argument("--limit", type=count, default=None, help="only the newest N items")
    messages.add_argument("--channel", default=None, help="only items of this channel id")
    messages.add_argument("--agent", default=None, help="only items belonging to this agent")

    search = sub.add_parser("search", help="search stored item bodies (the source header is not searched)")
    search.add_argument("--db", type=Path, required=True)
    search.add_argument("query")
    search.add_argument("--regex", action="store_true", help="QUERY is a regular expression")
    search.add_argument("--ignore-case", "-i", action="store_true")
    search.add_argument("--limit", type=count, default=50, help="at most this many hits (newest first)")
    search.add_argument("--json", action="store_true")

    migrate = sub.add_parser("migrate", help="apply pending database migrations")
    migrate.add_argument("--db", type=Path, required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not hasattr(args, "log_format"):
        # Offline commands print their output on stdout; their few log lines go to stderr.
        logs.configure("console")
    try:
        return COMMANDS[args.command](args)
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
        # The reader went away (`mcplhost messages | head`): stop quietly. Point stdout at
        # /dev/null so the interpreter's final flush does not report the same error again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR


# --- run / dev -----------------------------------------------------------------


async def _console(host: Host) -> None:
    """`mcplhost dev`: each line typed on the terminal is stored as local console input."""
    await host.ready.wait()
    while True:
        line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        if not line:
            return
        if line.strip() and host.ingest is not None:
            await host.ingest.store_surface("console", "operator", line.rstrip("\n"))


async def _serve(host: Host, *, seconds: float | None = None, console: bool = False) -> None:
    """Run the host until SIGTERM/SIGINT (or `seconds`), then stop it gracefully."""
    stop = anyio.Event()
    watchdog = watchdog_interval_s()

    async def watch_signals() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                structlog.get_logger().info("host.signal", signal=signal.Signals(signum).name)
                stop.set()
                return

    async def stop_after(delay: float) -> None:
        await anyio.sleep(delay)
        stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_signals)
        if seconds is not None:
            tg.start_soon(stop_after, seconds)
        if console:
            tg.start_soon(_console, host)
        await host.run(stop, watchdog_s=watchdog)
        tg.cancel_scope.cancel()


def _run_host(host: Host, *, seconds: float | None = None) -> None:
    """Run `_serve`; an operator error raised inside its task groups comes out as itself.

    Task groups wrap what their tasks raise in an ExceptionGroup; a store that
    cannot be opened must still reach `main` as the one-line StoreError.
    """
    try:
        anyio.run(lambda: _serve(host, seconds=seconds))
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


def cmd_run(args: argparse.Namespace) -> int:
    logs.configure(args.log_format, args.log_level)
    config = load_config(args.config or default_config_path())
    notifier = Notifier.from_environment(structlog.get_logger())
    try:
        _run_host(Host(config, notifier=notifier))
    finally:
        notifier.close()
    return EXIT_OK


def cmd_dev(args: argparse.Namespace) -> int:
    from .dev import dev_config, print_item

    logs.configure(args.log_format if args.log_format != "json" else "console", args.log_level)
    config = dev_config(args.db.resolve())
    print(f"mcplhost dev: {len(config.connectors)} stub connectors, database {args.db} "
          "(Ctrl-C to stop)", file=sys.stderr)
    _run_host(Host(config, on_stored=print_item), seconds=args.seconds)
    print(f"mcplhost dev: stopped; read what arrived with: mcplhost messages --db {args.db}", file=sys.stderr)
    return EXIT_OK


# --- offline commands ----------------------------------------------------------------


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.path)
    except ConfigError as exc:
        for problem in exc.problems or [exc.message + (f" ({exc.explanation})" if exc.explanation else "")]:
            print(problem)
        return EXIT_USAGE
    print(f"ok: {len(config.connectors)} connector(s), {len(config.agents)} agent(s)")
    return EXIT_OK


def _console_line(item: StoredItem) -> str:
    texts = [b.get("text", f"<{b.get('type')}>") for b in item.content]
    body = " ".join(t.replace("\n", " ⏎ ") for t in texts)
    who = item.participant or item.agent or "-"
    return f"{item.id:>6}  {item.role:<9} {who:<16} {body}"


def cmd_messages(args: argparse.Namespace) -> int:
    async def main() -> None:
        async with open_reader(args.db) as store:
            out = sys.stdout.buffer
            async for item in store.items.iterate(limit=args.limit, channel=args.channel, agent=args.agent):
                out.write(export_line(item) + b"\n" if args.json else (_console_line(item) + "\n").encode())
            out.flush()

    anyio.run(main)
    return EXIT_OK


def cmd_search(args: argparse.Namespace) -> int:
    from .readers import SearchError, search_items

    async def main() -> list[Any]:
        async with open_reader(args.db) as store:
            return await search_items(store, args.query, as_regex=args.regex, ignore_case=args.ignore_case,
                                      limit=args.limit)

    try:
        hits = anyio.run(main)
    except SearchError as exc:
        print(f"mcplhost: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for hit in hits:
        if args.json:
            sys.stdout.buffer.write(msgspec.json.encode(hit) + b"\n")
        else:
            print(f"{hit['id']:>6}  {hit.get('channelId') or '-':<24} {hit['snippet']}")
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    async def main() -> list[int]:
        async with open_store(args.db, migrate=False) as store:
            return await store.migrate()

    applied = anyio.run(main)
    print(f"applied {len(applied)} migration(s)" + (f": {', '.join(map(str, applied))}" if applied else ""))
    return EXIT_OK


COMMANDS = {
    "run": cmd_run,
    "dev": cmd_dev,
    "check-config": cmd_check_config,
    "messages": cmd_messages,
    "search": cmd_search,
    "migrate": cmd_migrate,
}


if __name__ == "__main__":
    sys.exit(main())
