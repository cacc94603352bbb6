"""One daemon per database: an advisory `flock` on a lock file beside it.

On a PostgreSQL store there is no file to put it beside: the lock is
``<host name>.lock`` in the state folder (mcplhost/config/paths.py), one
daemon per host name there; which host runs a connector or an agent is the
store's advisory locks' to decide.

`mcplhost run`, `dev` and `migrate` hold ``<database>.lock`` (an exclusive
`fcntl.flock`) for as long as they use the database; a second one refuses
with one line naming the holder's pid, which the holder writes into the file
as text. The kernel drops the lock when the holder's process ends however it
ends (kill -9 included), so a stale lock file never blocks a clean start; the
file itself is left in place on purpose, since unlinking it would let two
processes lock two different files of the same name. The descriptor is
close-on-exec: connectors never inherit the lock and cannot keep it alive
after the host is gone. Readers (`messages`, `search`) take no lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import OperatorError

LOCK_SUFFIX = ".lock"
#: The lock file is readable by the service's group, so an operator sees the pid; others get nothing.
LOCK_FILE_MODE = 0o640
#: Permission bits a lock file left by an older version loses: everything for others.
OTHERS = stat.S_IRWXO
#: The pid is a handful of digits; more than this in the file is not ours.
PID_TEXT_MAX_BYTES = 64


#: Why a second daemon on one SQLite database is refused, and what to do.
ONE_PER_DATABASE = "one daemon per database: stop that one first; messages and search may run beside it"
#: The same for a host on a PostgreSQL store: its lock is named by `[host] name` in the state folder.
ONE_PER_HOST_NAME = ("one daemon per host name and state folder: stop that one first, or give this one its own "
                     "[host] name (and control socket)")


class DatabaseInUse(OperatorError):
    """Another mcplhost process holds the database's lock (or, on PostgreSQL, this host name's)."""

    def __init__(self, database: Path | str, holder: int | None, explanation: str = ONE_PER_DATABASE) -> None:
        who = f"pid {holder}" if holder is not None else "a process whose pid is not written yet"
        super().__init__(f"{database}: in use by another mcplhost ({who})", explanation)
        self.holder = holder


def lock_path(database: Path) -> Path:
    """Where the lock for `database` lives: beside it, named after it."""
    return database.with_name(database.name + LOCK_SUFFIX)


def read_holder(path: Path) -> int | None:
    """The pid written in a lock file, or None when it holds no pid (yet)."""
    try:
        with open(path, "rb") as file:
            text = file.read(PID_TEXT_MAX_BYTES).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdecimal() else None


def refuse_if_held(database: Path | str, *, lock: Path | None = None, explanation: str = ONE_PER_DATABASE) -> None:
    """Raise DatabaseInUse when another process holds the database's lock now, creating nothing.

    A start asks this before anything else another daemon may hold (its control socket, its metrics port), so a
    second daemon on one database is told that, not the symptom; `hold_database` still decides. `lock`: the
    lock file when it is not beside the database (a PostgreSQL store's, in the state folder; `database` is then
    what the refusal names).
    """
    path = lock if lock is not None else lock_path(Path(database))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file yet (or none this user may read): hold_database says what is wrong
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise
        raise DatabaseInUse(database, read_holder(path), explanation) from None
    finally:
        os.close(fd)  # releases the shared lock, if it was taken


@contextmanager
def hold_database(database: Path | str, *, lock: Path | None = None,
                  explanation: str = ONE_PER_DATABASE) -> Iterator[Path]:
    """Hold the database's lock for the block, or raise DatabaseInUse naming the holder (`lock`: as in
    `refuse_if_held`)."""
    path = lock if lock is not None else lock_path(Path(database))
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LOCK_FILE_MODE)
    except OSError as exc:
        folder = "the state folder" if lock is not None else "the folder of store.path"
        raise OperatorError(f"{path}: cannot open the lock file: {exc.strerror}",
                            f"{folder} must be writable by the user mcplhost runs as") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            raise DatabaseInUse(database, read_holder(path), explanation) from None
        mode = os.fstat(fd).st_mode
        if mode & OTHERS:
            os.fchmod(fd, stat.S_IMODE(mode) & ~OTHERS)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        os.close(fd)  # releases the lock
