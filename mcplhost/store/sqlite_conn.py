"""An aiosqlite connection as the engine-neutral `Conn` (store/connection.py) the repositories use."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import aiosqlite

from mcplhost.store.connection import SQLITE, Engine, Params


class SqliteConn:
    """Statements on one aiosqlite connection; rows as tuples, `execute` answers the rowcount."""

    engine: Engine = SQLITE

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.raw = conn

    async def fetch(self, sql: str, params: Params = (), *, searched: object = None) -> list[tuple[Any, ...]]:
        return list(await self.raw.execute_fetchall(sql, params))  # type: ignore[arg-type]  # rows are tuples

    async def execute(self, sql: str, params: Params = ()) -> int:
        async with self.raw.execute(sql, params) as cursor:
            return cursor.rowcount

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        await self.raw.executemany(sql, rows)
