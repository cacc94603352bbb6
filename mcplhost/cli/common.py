"""What the `mcplhost` commands share: exit statuses, option types, database checks (mcplhost/cli/__init__.py)."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NoReturn, TypeVar

from ..config import (
    database_path_problems,
    redact_url,
    store_url_problem,
)
from ..errors import OperatorError
from ..store import is_database_url

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


#: A store named by --db: an SQLite file, or a PostgreSQL server's URL kept as written (a str).
Database = Path | str


def database_option(text: str) -> Database:
    """An argparse type for --db: a postgresql:// or postgres:// URL as written (one the driver can parse), else
    a non-empty path."""
    if not is_database_url(text):
        return path_option(text)
    why = store_url_problem(text)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return text


def sqlite_option(text: str) -> Path:
    """An argparse type for dev's --db: an SQLite file only (dev makes a fresh store with stub connectors)."""
    if is_database_url(text):
        raise argparse.ArgumentTypeError("dev runs on an SQLite file only, not a PostgreSQL URL (mcplhost run with "
                                         "[store] url runs on PostgreSQL)")
    return path_option(text)


def shown(db: Database) -> str:
    """--db as a line may show it: a URL's password as ***."""
    return redact_url(db) if isinstance(db, str) else str(db)


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


#: A --db value, path or URL, kept as the type it came as.
AnyDatabase = TypeVar("AnyDatabase", Path, str)


def existing_database(path: AnyDatabase) -> AnyDatabase:
    """For readers: a directory is named as one, not reported as "no such database" (a URL: as given)."""
    if isinstance(path, str):
        return path
    if path.is_dir():
        raise OperatorError(f"{path}: is a directory, not a database file",
                            "pass the database file itself, e.g. --db /var/lib/mcplhost/mcplhost.db")
    return path
