"""A real PostgreSQL server for the tests, from the machine's own server binaries.

    def test_x(postgres_db: PostgresDatabase) -> None:
        ...  # postgres_db.url: "postgresql://postgres@/test_1?host=/tmp/mcplhost-pg-…&port=5432"

One server per test session (so one per pytest-xdist worker), started the
first time a test asks for it and stopped at the session's end: a cluster made
by `initdb` in a fresh temporary folder, the server listening on a Unix socket
in that folder and on no TCP port. (initdb costs about a second of CPU; one
cluster copied by every worker saved little: copying its 30 MB costs a good
part of that.) Each test that asks for `postgres_db` gets a database of its
own (`CREATE DATABASE … TEMPLATE template0`), dropped when the next one is
created (one psql run per test) or with the server.

PostgreSQL refuses to run as root, and the tests run as root here and in CI:
then initdb and the server run as Debian's `postgres` user (or `nobody` where
there is none), which owns the temporary folder; the tests connect as the
server's superuser `postgres` over the socket (trust authentication, in a
folder only that user and root can enter).

fsync is off: the tests kill our daemon, never the server, and what a killed
client committed is in the server's memory and the page cache either way.

Where no server can be started, a test that needs one fails in CI (`CI=true`;
.ci/run installs Debian's `postgresql` package where the binaries are missing)
and is skipped with the reason elsewhere.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar
from urllib.parse import quote

import pytest

#: The server's superuser, which the tests connect as.
SUPERUSER = "postgres"
#: Names the socket file (.s.PGSQL.5432) in the server's own folder; no TCP port is opened.
PORT = 5432
#: The binaries the fixture runs; a folder missing one of them is not a server installation.
BINARIES = ("initdb", "pg_ctl", "postgres", "psql")
#: DROP DATABASE … WITH (FORCE) is 13's; CREATE DATABASE … STRATEGY FILE_COPY (faster here than 15's default
#: WAL_LOG: with fsync off its checkpoints cost little) is 15's.
OLDEST_MAJOR = 13
FILE_COPY_MAJOR = 15
#: Debian's packages put each major version's binaries here (pg_config may come from libpq-dev alone).
DEBIAN_BINDIRS = Path("/usr/lib/postgresql")
#: Unprivileged users the server may run as when the tests run as root, in order of preference.
SERVER_USERS = ("postgres", "nobody")
#: Bounds on the server's commands (initdb takes about a second on an idle machine, pg_ctl waits for the server).
COMMAND_TIMEOUT_S = 120
START_TIMEOUT_S = 60
T = TypeVar("T")
#: Appended to the new cluster's postgresql.conf: the socket in the server's folder only, and no durability
#: the tests do not need.
SETTINGS = """
listen_addresses = ''
unix_socket_directories = '{socket_dir}'
port = {port}
fsync = off
synchronous_commit = off
full_page_writes = off
TimeZone = 'UTC'
"""


class Unavailable(Exception):
    """No PostgreSQL server can be started here; the message says why."""


@dataclass(frozen=True)
class Account:
    """The unprivileged user the server runs as when the tests run as root."""

    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class PostgresDatabase:
    """A fresh database on the session's server."""

    name: str
    url: str


@dataclass
class PostgresServer:
    """A running server: its binaries, its folder (data/, the socket, server.log) and who runs it."""

    bindir: Path
    folder: Path
    account: Account | None
    numbers: Iterator[int] = field(default_factory=itertools.count)
    #: Databases whose tests are over, dropped by the next create_database (or with the server).
    finished: list[str] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def url(self, database: str) -> str:
        """A libpq URL for `database` over the Unix socket (asyncpg and psql both read it)."""
        return f"postgresql://{SUPERUSER}@/{database}?host={quote(str(self.folder), safe='')}&port={PORT}"

    def sql(self, *statements: str) -> str:
        """Run statements one by one as the superuser in the `postgres` database (psql: no driver needed).

        Each is its own transaction (CREATE and DROP DATABASE cannot be in one); the output of all, unaligned.
        """
        commands = [part for statement in statements for part in ("-c", statement)]
        return run([str(self.bindir / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                    "-d", self.url("postgres"), *commands], None, self.folder)

    def create_database(self, template: str = "template0") -> PostgresDatabase:
        """A new database, a copy of `template` (empty by default); the finished tests' databases are dropped in
        the same psql run."""
        name = f"test_{next(self.numbers)}"
        strategy = " STRATEGY FILE_COPY" if major_version(self.data) >= FILE_COPY_MAJOR else ""
        # FORCE: a test that left a connection open (a failed one, say) does not keep its database.
        drops = [f'DROP DATABASE IF EXISTS "{old}" WITH (FORCE)' for old in self.finished]
        self.sql(*drops, f'CREATE DATABASE "{name}" TEMPLATE "{template}"{strategy}')
        self.finished.clear()
        return PostgresDatabase(name=name, url=self.url(name))

    def finish(self, database: PostgresDatabase) -> None:
        """`database`'s test is over: drop it with the next create (saves a psql run per test)."""
        self.finished.append(database.name)

    def stop(self) -> None:
        """Stop the server if it runs (immediate: its data is thrown away) and remove its folder."""
        try:
            if (self.data / "postmaster.pid").exists():
                run([str(self.bindir / "pg_ctl"), "stop", "-w", "-m", "immediate", "-D", str(self.data)],
                    self.account, self.folder)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str) -> NoReturn:
    """Fail in CI, where the server must be there; skip with the reason elsewhere."""
    if in_ci():
        pytest.fail(f"PostgreSQL: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL: {reason}")


def or_unavailable(action: Callable[[], T]) -> T:
    """`action`'s result; where it raises Unavailable, fail or skip (outside the handler: one plain message)."""
    try:
        return action()
    except Unavailable as exc:
        reason = str(exc)
    unavailable(reason)


def run(command: list[str], account: Account | None, cwd: Path) -> str:
    """Run a server command (as `account` when given), bounded; its stdout, or Unavailable with its stderr."""
    as_user: dict[str, Any] = {} if account is None else {"user": account.uid, "group": account.gid,
                                                          "extra_groups": []}
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "TZ": "UTC"}
    try:
        done = subprocess.run(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=COMMAND_TIMEOUT_S, **as_user)
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unavailable(f"{Path(command[0]).name}: {exc}") from exc
    if done.returncode != 0:
        tail = " ".join(done.stderr.split()[-60:]) or f"exit status {done.returncode}"
        raise Unavailable(f"{Path(command[0]).name} failed: {tail}")
    return done.stdout


def version_key(folder: Path) -> tuple[int, ...]:
    """/usr/lib/postgresql/15/bin → (15,): the newest major version first when sorted in reverse."""
    parts = folder.parent.name.split(".")
    return tuple(int(part) for part in parts) if all(part.isdigit() for part in parts) else (0,)


def server_bindir() -> Path:
    """The folder holding the server binaries: `pg_config --bindir`, else Debian's newest /usr/lib/postgresql/*/bin."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        try:
            reported = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            reported = ""
        if reported.strip():
            candidates.append(Path(reported.strip()))
    candidates += sorted(DEBIAN_BINDIRS.glob("*/bin"), key=version_key, reverse=True)
    for folder in candidates:
        if all(os.access(folder / name, os.X_OK) for name in BINARIES):
            return folder
    raise Unavailable(f"no server binaries ({', '.join(BINARIES)}) in `pg_config --bindir` or "
                      f"{DEBIAN_BINDIRS}/*/bin; install Debian's postgresql package")


def server_account() -> Account | None:
    """Who runs the server: None (ourselves) unless we are root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return None
    for name in SERVER_USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return Account(name=name, uid=entry.pw_uid, gid=entry.pw_gid)
    raise Unavailable(f"running as root and none of the users {', '.join(SERVER_USERS)} exists to run the server as")


def reachable_by_others(folder: Path) -> bool:
    """Whether every folder from / down to `folder` lets another user through (o+x)."""
    return all(path.stat().st_mode & stat.S_IXOTH for path in (folder, *folder.parents))


def server_folder(account: Account | None) -> Path:
    """A new folder for the server's data and socket, owned by the server's user and closed to everyone else.

    Under the temporary folder unless the server's user could not reach it (a private TMPDIR), then /tmp.
    """
    parent = Path(tempfile.gettempdir())
    if account is not None and not reachable_by_others(parent):
        parent = Path("/tmp")
    folder = Path(tempfile.mkdtemp(prefix="mcplhost-pg-", dir=parent))  # mode 0700
    if account is not None:
        os.chown(folder, account.uid, account.gid)
    return folder


def major_version(data: Path) -> int:
    """The cluster's major version, from the PG_VERSION file initdb writes ("15")."""
    return int((data / "PG_VERSION").read_text(encoding="ascii").strip().split(".")[0])


def initdb(bindir: Path, account: Account | None, data: Path) -> None:
    run([str(bindir / "initdb"), "-D", str(data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C",
         "--no-sync"], account, data.parent)
    if major_version(data) < OLDEST_MAJOR:
        raise Unavailable(f"the server in {bindir} is version {major_version(data)}; the tests need {OLDEST_MAJOR}+")


def start_server() -> PostgresServer:
    """initdb a new cluster and start its server; Unavailable, with what went wrong, when either fails."""
    bindir = server_bindir()
    account = server_account()
    folder = server_folder(account)
    server = PostgresServer(bindir=bindir, folder=folder, account=account)
    try:
        initdb(bindir, account, server.data)
        with (server.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(SETTINGS.format(socket_dir=str(folder).replace("'", "''"), port=PORT))
        try:
            run([str(bindir / "pg_ctl"), "start", "-w", "-t", str(START_TIMEOUT_S), "-D", str(server.data),
                 "-l", str(folder / "server.log")], account, folder)
        except Unavailable as exc:
            log = folder / "server.log"
            detail = log.read_text(encoding="utf-8", errors="replace")[-2000:] if log.exists() else ""
            raise Unavailable(f"{exc}; server.log: {detail.strip()}") from exc
    except BaseException:
        with contextlib.suppress(Unavailable):
            server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The session's server (one per xdist worker), started on first use; a failure is cached for the session."""
    server = or_unavailable(start_server)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_db(postgres_server: PostgresServer) -> Iterator[PostgresDatabase]:
    """A fresh, empty database of this test's own on the session's server."""
    database = or_unavailable(postgres_server.create_database)
    try:
        yield database
    finally:
        postgres_server.finish(database)
