"""The runtime file of a daemon's connector process groups, so the next start can stop what outlived it.

Beside the daemon's lock, ``<database>.children`` (on PostgreSQL ``<host name>.children`` in the state
folder, mcplhost/config/paths.py) holds one ``PGID START``
line per running connector: its process group (the connector leads its own
session) and the leader's start time in clock ticks since boot, from
``/proc/PID/stat``. A daemon that dies without stopping its connectors leaves
the file behind; the next start, holding the lock, stops every process still
in those groups before it spawns anything (docs/operations.md#when-the-host-dies). The parent-death signal (process.py) already kills each connector;
this file catches what that cannot: the processes a connector started in its
group. It needs /proc (Linux); where there is none, nothing is recorded.

A recorded group is trusted only while it is provably the same: a live
leader must have the recorded start time (else its pid was reused), and a
member must be in that session, belong to this user and have started no
earlier than the leader did.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger()

CHILDREN_SUFFIX = ".children"
#: One line per connector; a file longer than this was not written by us, and is ignored.
CHILDREN_FILE_MAX_BYTES = 64 * 1024
#: Only the daemon's user needs to read it.
CHILDREN_FILE_MODE = 0o600
PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """What /proc says about one process, as far as this rule needs it."""

    pid: int
    pgid: int
    sid: int
    start: int  # clock ticks after boot
    uid: int


def leftovers(processes: Iterable[ProcessInfo], pgid: int, start: int, uid: int) -> list[int]:
    """The pids of a recorded group (`pgid`, its leader's `start`) that still run and are provably ours."""
    processes = list(processes)
    leader = next((p for p in processes if p.pid == pgid), None)
    if leader is not None and leader.start != start:
        return []  # the pid was reused: another program's group now
    return sorted(p.pid for p in processes
                  if p.pgid == pgid and p.sid == pgid and p.uid == uid and p.start >= start)


def parse_stat(pid: int, text: str, uid: int) -> ProcessInfo | None:
    """A /proc/PID/stat line as ProcessInfo; None when it is not one (the name may hold spaces and parens)."""
    fields = text.rpartition(")")[2].split()
    try:
        # After the name: state, ppid, pgrp, session, ..., starttime is the 20th field from here.
        return ProcessInfo(pid=pid, pgid=int(fields[2]), sid=int(fields[3]), start=int(fields[19]), uid=uid)
    except (IndexError, ValueError):
        return None


def read_process(pid: int) -> ProcessInfo | None:
    """One process from /proc, or None when it is gone (or /proc is not there)."""
    try:
        text = (PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
        uid = (PROC / str(pid)).stat().st_uid
    except OSError:
        return None
    return parse_stat(pid, text, uid)


def read_processes() -> Iterator[ProcessInfo]:
    try:
        names = os.listdir(PROC)
    except OSError:
        return
    for name in names:
        if name.isdecimal():
            info = read_process(int(name))
            if info is not None:
                yield info


class ChildRecord:
    """The running connectors' groups of this daemon, kept in the runtime file as they come and go."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._groups: dict[int, int] = {}

    def add(self, pid: int) -> None:
        """Record a just-spawned connector (it leads its own group)."""
        info = read_process(pid)
        if info is not None:
            self._groups[pid] = info.start
            self.save()

    def remove(self, pid: int) -> None:
        """Forget a connector whose group has been stopped."""
        if self._groups.pop(pid, None) is not None:
            self.save()

    def save(self) -> None:
        # Small and local: written whole and renamed into place, so a crash never leaves half a line.
        text = "".join(f"{pgid} {start}\n" for pgid, start in self._groups.items())
        temporary = self.path.with_name(self.path.name + ".new")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, CHILDREN_FILE_MODE)
            try:
                os.fchmod(fd, CHILDREN_FILE_MODE)  # a leftover temporary keeps its own mode through O_CREAT
                os.write(fd, text.encode())
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
        except OSError as exc:
            log.warning("host.children_file_unwritable", path=str(self.path), error=exc.strerror)


def recorded_groups(path: Path) -> list[tuple[int, int]]:
    """The `(pgid, start)` lines of a runtime file; lines that are not two numbers are skipped."""
    try:
        with open(path, "rb") as file:
            data = file.read(CHILDREN_FILE_MAX_BYTES + 1)
    except OSError:
        return []
    if len(data) > CHILDREN_FILE_MAX_BYTES:
        return []
    groups = []
    for line in data.decode("ascii", "replace").splitlines():
        parts = line.split()
        if len(parts) == 2 and all(p.isdecimal() for p in parts) and int(parts[0]) > 1:
            groups.append((int(parts[0]), int(parts[1])))
    return groups


def stop_leftovers(path: Path) -> list[int]:
    """SIGKILL every process still in a group the runtime file names; return their pids."""
    groups = recorded_groups(path)
    if not groups:
        return []
    processes = list(read_processes())
    killed = []
    for pgid, start in groups:
        for pid in leftovers(processes, pgid, start, os.getuid()):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass  # gone meanwhile, or not ours to signal
    return killed


#: The record of the daemon running in this process (None: a host in a test, or no lock held).
CHILD_RECORD: ContextVar[ChildRecord | None] = ContextVar("child_record", default=None)


def children_path(lock: Path) -> Path:
    """The runtime file beside the daemon's lock file (`<database>.lock`, or `<host name>.lock`)."""
    return lock.with_name(lock.name.removesuffix(".lock") + CHILDREN_SUFFIX)


@contextmanager
def recording_children(lock: Path) -> Iterator[ChildRecord]:
    """With the database's lock held: stop what the last daemon left running, then record this one's children."""
    path = children_path(lock)
    killed = stop_leftovers(path)
    if killed:
        log.warning("host.leftovers_stopped", pids=killed,
                    detail="processes of connectors a previous daemon on this database left running")
    record = ChildRecord(path)
    record.save()
    token = CHILD_RECORD.set(record)
    try:
        yield record
    finally:
        CHILD_RECORD.reset(token)
