"""The offline commands: check-config, the database's readers (messages, search, turns, outbox, explain),
backup, migrate, and `connector`, which runs a bundled connector."""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec

from ..config import read_config, secret_values
from ..errors import ConfigError, OperatorError
from ..lock import hold_database
from ..protocol.grants import unknown_grant_problem
from ..secrets import Secrets
from ..store import open_reader, open_store
from ..store.items import StoredItem, export_line
from .common import (
    EXIT_OK,
    EXIT_USAGE,
    FOLLOW_POLL_S,
    Database,
    existing_database,
    shown,
    usable_database,
)
from .serve import _run_config

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
    from ..store.backup import BackupExists, backup

    db: Database = args.db
    if isinstance(db, str):  # SQLite's online backup has no PostgreSQL counterpart here: say what does
        print(f"mcplhost: backup: {shown(db)} is a PostgreSQL store: back it up with pg_dump (e.g. pg_dump "
              "--format=custom --file=OUT URL), which takes a consistent copy while the daemon runs",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        done = backup(existing_database(db), args.out)
    except BackupExists as exc:
        print(f"mcplhost: {exc.message} ({exc.explanation})", file=sys.stderr)
        return EXIT_USAGE
    print(f"backed up {args.db} to {done.path}: {done.pages} pages, {done.bytes} bytes, integrity_check ok")
    return EXIT_OK


def cmd_search(args: argparse.Namespace) -> int:
    from ..store.readers import SearchError, SearchResult, search_items, stopped_early_warning, timed_out_warning
    from ..store.search_query import SearchFilter

    async def main() -> SearchResult:
        async with open_reader(existing_database(args.db)) as store:
            return await search_items(store, args.query, as_regex=args.regex, ignore_case=args.ignore_case,
                                      limit=args.limit, deadline_s=args.timeout,
                                      where=SearchFilter(channel=args.channel, since_ms=args.since))

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
    from ..store import turn_line
    from ..store.readers import turn_plain_line, turns_with_triggers

    if args.json:  # the export's keys only (README.md#commands): the waking ids say what woke each turn
        return _print_rows(args, lambda store: store.turns.iterate(agent=args.agent, limit=args.limit),
                           turn_line, turn_plain_line)
    return _print_rows(args, lambda store: turns_with_triggers(store, agent=args.agent, limit=args.limit),
                       lambda pair: turn_line(pair[0]), lambda pair: turn_plain_line(*pair))


def cmd_outbox(args: argparse.Namespace) -> int:
    from ..store.outbox import outbox_line
    from ..store.readers import outbox_plain_line

    return _print_rows(args, lambda store: store.outbox.iterate(state=args.state), outbox_line, outbox_plain_line)


def cmd_explain(args: argparse.Namespace) -> int:
    """Per agent (config order), why the item did or did not wake it (docs/agents.md#explain)."""
    from ..agents.wakes.explain import explain_item, explanation_line, plain_lines
    from ..agents.wakes.rules import addressing_of
    from ..dev import config_beside

    # The config `mcplhost dev` wrote beside its database comes before the environment's and ./mcplhost.toml:
    # it is the one that database was written with (README.md#deviations-and-decisions). A PostgreSQL store has
    # no folder to look in, and ./mcplhost.toml may be any host's: its config is named.
    if isinstance(args.db, str):
        if args.config is None and not os.environ.get("MCPLHOST_CONFIG"):
            raise ConfigError("explain: --db names a PostgreSQL store, which has no folder holding its config",
                              "pass --config PATH (or set MCPLHOST_CONFIG): the rules are recomputed from it")
        config = _run_config(args.config)
    else:
        beside = config_beside(args.db)
        config = _run_config(args.config or (beside if beside.is_file() else None))
    agents = config.agents
    addressing = addressing_of(config.connectors, config.agents)
    if args.agent is not None:
        agents = [agent for agent in agents if agent.name == args.agent]
        if not agents:
            raise ConfigError(f"no agent named {args.agent!r} in the config")

    async def main() -> list[Any] | None:
        async with open_reader(existing_database(args.db)) as store:
            return await explain_item(store, agents, args.item_id, addressing)

    answers = anyio.run(main)
    if answers is None:
        raise OperatorError(f"no item {args.item_id} in {shown(args.db)}")
    out = sys.stdout.buffer
    secrets = Secrets(secret_values(config))  # what the daemon redacts, from the same config (docs/agents.md#secrets)
    for answer in answers:
        out.write(secrets.redact_bytes(explanation_line(answer) + b"\n" if args.json else "".join(
            line + "\n" for line in plain_lines(answer)).encode()))
    out.flush()
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    """Takes the database's lock like `run`: migrating under a running daemon is refused. On PostgreSQL the
    store serializes migrations itself, and daemons of other hosts may run (they refuse a newer schema)."""
    db: Database = args.db if isinstance(args.db, str) else usable_database(args.db)  # a URL: the server's to answer

    async def main() -> list[int]:
        async with open_store(db, migrate=False) as store:
            return await store.migrate()

    with hold_database(db) if isinstance(db, Path) else contextlib.nullcontext():
        applied = anyio.run(main)
    print(f"applied {len(applied)} migration(s)" + (f": {', '.join(map(str, applied))}" if applied else ""))
    return EXIT_OK


def cmd_connector(args: argparse.Namespace) -> int:
    """Replace this process with `python -m mcplhost.connectors.NAME ARGS` (same pid, so signals reach it)."""
    from ..dev import bundled_connectors

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
