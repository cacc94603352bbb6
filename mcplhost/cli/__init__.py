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

The commands live by family: `serve.py` (run, dev), `data.py` (the offline
readers and tools), `ask.py` (the control socket); `common.py` holds what
they share.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import __version__, logs
from ..errors import ConfigError, OperatorError
from .ask import cmd_restart_connector, cmd_status
from .common import (
    CLI_SEARCH_DEADLINE_S,
    DEV_DB,
    EPILOG,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    LOCK_EPILOG,
    SINCE_FORMS,
    Parser,
    count,
    database_option,
    path_option,
    reader_gone,
    seconds,
    since_option,
    sqlite_option,
)
from .data import (
    cmd_backup,
    cmd_check_config,
    cmd_connector,
    cmd_explain,
    cmd_messages,
    cmd_migrate,
    cmd_outbox,
    cmd_search,
    cmd_turns,
)
from .serve import cmd_dev, cmd_run

#: What --db takes wherever it is (dev's takes a file only).
DB_HELP = "the SQLite file, or a postgresql:// URL"


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
    dev.add_argument("--db", type=sqlite_option, default=Path(DEV_DB), help=f"SQLite file (default: ./{DEV_DB})")
    dev.add_argument("--console", action="store_true",
                     help="also serve the web console on a free loopback port (its address is on the banner)")
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
    messages.add_argument("--db", type=database_option, required=True, help=DB_HELP)
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
    backup.add_argument("--db", type=database_option, required=True,
                        help="the SQLite file (a PostgreSQL store is backed up with pg_dump)")
    backup.add_argument("out", type=path_option, metavar="OUT", help="the new file; it must not exist")

    search = sub.add_parser("search", help="search stored item bodies (the source header is not searched)",
                            epilog=EPILOG)
    search.add_argument("--db", type=database_option, required=True, help=DB_HELP)
    search.add_argument("query")
    search.add_argument("--regex", action="store_true", help="QUERY is a regular expression")
    search.add_argument("--ignore-case", "-i", action="store_true")
    search.add_argument("--limit", type=count, default=50, help="at most this many hits (newest first)")
    search.add_argument("--channel", default=None, help="only items of this channel id")
    search.add_argument("--since", type=since_option, default=None, metavar="TIME",
                        help=f"only items created at or after TIME: {SINCE_FORMS}")
    search.add_argument("--timeout", type=seconds, default=CLI_SEARCH_DEADLINE_S, metavar="SECONDS",
                        help="stop after this long with the hits found so far (default %(default)g)")
    search.add_argument("--json", action="store_true")

    turns = sub.add_parser("turns", help="print agent turns, oldest first (why each woke, how it ended)",
                           epilog=EPILOG)
    turns.add_argument("--db", type=database_option, required=True, help=DB_HELP)
    turns.add_argument("--json", action="store_true", help="one JSON object per line")
    turns.add_argument("--agent", default=None, help="only this agent's turns")
    turns.add_argument("--limit", type=count, default=None, help="only the newest N turns")

    explain = sub.add_parser("explain", help="per agent, why an item did or did not wake it, and what came of it",
                             epilog="exit status: 0 done; 1 no item has that id (one line); 2 an unknown --agent "
                                    "or a usage or config error.")
    explain.add_argument("item_id", type=count, metavar="ITEM_ID")
    explain.add_argument("--db", type=database_option, required=True, help=DB_HELP)
    explain.add_argument("--config", type=path_option, default=None,
                         help="config file (default: $MCPLHOST_CONFIG, then ./mcplhost.toml): the rules recomputed")
    explain.add_argument("--agent", default=None, help="only this agent")
    explain.add_argument("--json", action="store_true", help="one JSON object per agent, one a line")

    outbox = sub.add_parser("outbox", help="print publishes and their fate, oldest first", epilog=EPILOG)
    outbox.add_argument("--db", type=database_option, required=True, help=DB_HELP)
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
    migrate.add_argument("--db", type=database_option, required=True, help=DB_HELP)

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

