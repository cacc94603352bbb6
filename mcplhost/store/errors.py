"""Errors the store raises.

`StoreError` and its subclasses are the operator's to fix (a path, a version,
a backup): they are `OperatorError`s, so each carries an `explanation` saying
what to do, kept apart from the message, and mcplhost/cli/ prints them as one line.
"""

from __future__ import annotations

from mcplhost.errors import OperatorError


class StoreError(OperatorError):
    """The database cannot be used as it is; `explanation` says what to do."""

    def __init__(self, message: str, *, explanation: str) -> None:
        super().__init__(message, explanation)


class SchemaTooNew(StoreError):
    """The database was migrated by a newer mcplhost than this one."""

    def __init__(self, found: int, newest_known: int, *, path: str | None = None) -> None:
        where = f"{path}: " if path else ""
        super().__init__(
            f"{where}database schema version {found} is newer than this mcplhost "
            f"knows (newest {newest_known})",
            explanation=(
                f"run an mcplhost release that knows schema version {found}, or restore "
                "a backup taken before the upgrade; mcplhost never downgrades a database"
            ),
        )
        self.found = found
        self.newest_known = newest_known


class SchemaBehind(StoreError):
    """A read-only opener found migrations it cannot apply itself."""

    def __init__(self, found: int, newest_known: int, *, path: str) -> None:
        super().__init__(
            f"{path}: database schema version {found} is older than this mcplhost "
            f"expects ({newest_known})",
            explanation=f"run `mcplhost migrate --db {path}` (or start the daemon once), then retry",
        )
        self.found = found
        self.newest_known = newest_known


class StoreMissing(StoreError):
    """A reader was pointed at a database file that does not exist."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path}: no such database",
            explanation="check the path; `mcplhost run` or `mcplhost migrate --db PATH` creates it",
        )
        self.path = path


class BrokenMigration(StoreError):
    """A migration failed; its transaction was rolled back, nothing of it applied."""

    def __init__(self, version: int, name: str, cause: BaseException) -> None:
        super().__init__(
            f"migration {version:04d}_{name} failed and was rolled back: {cause}",
            explanation=(
                "the database is unchanged by this migration; fix the cause "
                "(disk space, permissions, a hand-edited database) and start again"
            ),
        )
        self.version = version
        self.name = name


#: How many of a foreign database's table names the error message names.
FOREIGN_TABLES_SHOWN = 5


class ForeignDatabase(StoreError):
    """The file holds another application's tables: mcplhost will not migrate or write it."""

    def __init__(self, tables: list[str], *, path: str | None = None) -> None:
        where = f"{path}: " if path else ""
        shown = ", ".join(tables[:FOREIGN_TABLES_SHOWN]) + (", ..." if len(tables) > FOREIGN_TABLES_SHOWN else "")
        super().__init__(
            f"{where}the database already holds tables of another application ({shown})",
            explanation=(
                "point store.path (or --db) at a new file or at an mcplhost database; "
                "mcplhost never adds its tables to another application's database"
            ),
        )
        self.tables = tables
