"""The files of an SQLite store: the database and the WAL and shared-memory files SQLite keeps beside it.

All three are the daemon user's alone, whatever the umask it was started
with (docs/operations.md#files-and-permissions): `make_private` creates a
missing database file with `DATABASE_MODE` before SQLite opens it, and SQLite
gives the WAL and shared-memory files it creates the database file's own
mode. A file that is already there loses any access for others (its group's
is the operator's choice and stays).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

WAL_SUFFIX = "-wal"
SHM_SUFFIX = "-shm"
#: A new database file's mode: its owner's (SQLite copies it to the WAL and shared-memory files).
DATABASE_MODE = 0o600
#: The permission bits no file of the store keeps: everything for others.
OTHERS = stat.S_IRWXO


def database_files(path: Path) -> list[Path]:
    """The database and the files SQLite keeps beside it, whether they exist or not."""
    return [path, path.with_name(path.name + WAL_SUFFIX), path.with_name(path.name + SHM_SUFFIX)]


def make_private(path: Path) -> None:
    """Create the database file with DATABASE_MODE if it is missing; take others' access from those that exist.

    OSError as the file system raises it (the caller reports it as the store it cannot open).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, DATABASE_MODE)
    except FileExistsError:
        pass
    else:
        os.fchmod(fd, DATABASE_MODE)  # the umask may have taken bits; it never adds any, but say it exactly
        os.close(fd)
    for file in database_files(path):
        try:
            mode = os.stat(file).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISREG(mode) and mode & OTHERS:
            os.chmod(file, stat.S_IMODE(mode) & ~OTHERS)
