"""The writer's connection with every text and blob parameter redacted first, on either engine.

The one place every stored row passes, so no secret value is written whatever its path
(docs/agents.md#secrets). With no secrets held each call costs one truth test.

`fetch(..., searched=version)`: the caller searched exactly these parameters with `Secrets.find_in_values`
and found none while the secrets were at `version` (`Secrets.version`); the search is not made again unless
the set changed since (ingest searches a request's rows once: docs/architecture.md#the-inbound-hot-path).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mcplhost.secrets import BLOB_TYPES, Secrets
from mcplhost.store.connection import Conn, Engine, Params


class RedactingWriter:
    """A `Conn` that redacts the held secrets from every parameter before `conn` sees it."""

    def __init__(self, conn: Conn, secrets: Secrets) -> None:
        self._conn = conn
        self._secrets = secrets

    @property
    def engine(self) -> Engine:
        return self._conn.engine

    def _redacted(self, params: Params) -> Params:
        secrets = self._secrets
        if not params:
            return params
        # One search over the row's texts first: most rows hold no secret and are passed on as they are.
        if not secrets.find_in_values(params):
            return params
        return [_redact_value(secrets, value) for value in params]

    async def fetch(self, sql: str, params: Params = (), *, searched: object = None) -> list[tuple[Any, ...]]:
        if self._secrets and (searched is None or searched is not self._secrets.version):
            params = self._redacted(params)
        return await self._conn.fetch(sql, params)

    async def execute(self, sql: str, params: Params = ()) -> int:
        if self._secrets:
            params = self._redacted(params)
        return await self._conn.execute(sql, params)

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        if self._secrets:
            rows = [self._redacted(row) for row in rows]
        await self._conn.executemany(sql, rows)


def _redact_value(secrets: Secrets, value: Any) -> Any:
    if isinstance(value, str):
        return secrets.redact(value)
    if isinstance(value, BLOB_TYPES):
        return secrets.redact_bytes(bytes(value))
    return value
