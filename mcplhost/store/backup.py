"""A consistent copy of a store while its daemon runs: SQLite's online backup (docs/operations.md#backups-retention-and-following).

The source is opened read-only and a read transaction is begun before the
first page is copied, so every step reads the same snapshot: the copy holds
exactly what was committed when the backup started, and a commit made
meanwhile by the daemon neither blocks on the backup (WAL: a reader never
holds up the writer) nor restarts it (SQLite restarts a backup whose source
changed between steps only when the source connection has no snapshot of
its own). Pages are copied BACKUP_PAGES_PER_STEP at a time, with no sleep
between steps.

The copy is written to a temporary file beside OUT, switched to the
rollback journal (one self-contained file, no -wal or -shm beside it),
checked with `PRAGMA integrity_check`, and only then linked to OUT; `link`
fails if OUT exists, so an existing file is never overwritten, not even one
created while the backup ran, and a failed backup leaves no OUT behind.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import msgspec

from mcplhost.store.db import connect_read_only
from mcplhost.store.errors import StoreError, StoreMissing
from mcplhost.store.files import make_private

#: Pages copied per backup step (4 MiB at SQLite's default 4 KiB page).
BACKUP_PAGES_PER_STEP = 1024

_BACKUP_EXPLANATION = "check that --db names an mcplhost database this user can read, and that OUT's disk has room"


class BackupExists(StoreError):
    """OUT already exists: a backup never overwrites a file."""


class BackupDone(msgspec.Struct, frozen=True):
    """What `backup` wrote."""

    path: Path
    pages: int
    bytes: int
    steps: int


def backup(source: Path, out: Path) -> BackupDone:
    """Copy the store at `source` to the new file `out` (blocking: run it in a worker thread or a CLI).

    Raises StoreMissing without a source file, BackupExists when `out`
    exists, StoreError when the copy cannot be made or fails its integrity check.
    """
    if not source.is_file():
        raise StoreMissing(str(source))
    if out.exists() or out.is_symlink():
        raise BackupExists(f"{out}: already exists", explanation="a backup never overwrites; name a new file")
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    src = connect_read_only(source)
    try:
        make_private(partial)  # every chat is in it: this user's alone, like the database (store/files.py)
        dst = sqlite3.connect(partial, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        src.close()
        raise StoreError(f"{out}: cannot create the copy: {exc}",
                         explanation="check that OUT's folder exists and this user can write to it") from exc
    steps = 0

    def step(_status: int, _remaining: int, _total: int) -> None:
        nonlocal steps
        steps += 1

    try:
        try:
            src.execute("BEGIN")  # the snapshot every step reads (see the module docstring)
            src.execute("SELECT count(*) FROM sqlite_schema").fetchone()
            src.backup(dst, pages=BACKUP_PAGES_PER_STEP, progress=step)
            src.execute("COMMIT")
            dst.execute("PRAGMA journal_mode = DELETE")
            verdict = [row[0] for row in dst.execute("PRAGMA integrity_check")]
            (pages,) = dst.execute("PRAGMA page_count").fetchone()
        finally:
            dst.close()
            src.close()
        if verdict != ["ok"]:
            raise StoreError(f"{out}: the copy failed its integrity check: {'; '.join(verdict[:5])}",
                             explanation="the source may be damaged; check it with PRAGMA integrity_check")
        try:
            os.link(partial, out)
        except FileExistsError:
            raise BackupExists(f"{out}: already exists", explanation="a backup never overwrites; name a new file") \
                from None
    except sqlite3.Error as exc:
        raise StoreError(f"{source}: the backup failed: {exc}", explanation=_BACKUP_EXPLANATION) from exc
    finally:
        partial.unlink(missing_ok=True)
    return BackupDone(path=out, pages=pages, bytes=out.stat().st_size, steps=steps)
