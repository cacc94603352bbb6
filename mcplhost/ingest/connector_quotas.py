"""Each connector's quota as one object: its sliding hour, its spell of refusals, its refusal counts.

docs/operations.md#quotas. `ConnectorQuotas` holds one `ConnectorQuota` per
connector heard from, seeded from the store the first time (a restart resets
nothing; a concurrent first request waits for that seed rather than reserve
before it) and again after `forget` (a host taking the connector over from
another on a shared store: the counts in the store are both hosts'); `ConnectorQuota` reserves, refuses and gives back, and logs a
spell's start and end. The rules themselves are ingest/quotas.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import anyio

from mcplhost.ingest.quotas import QUOTAS, QuotaLimits, QuotaRefusal, QuotaSpell, QuotaWindow
from mcplhost.store.quotas import QuotaUsage, oldest_bucket

__all__ = ["ConnectorQuota", "ConnectorQuotas", "UsageReader"]


class UsageReader(Protocol):
    """The store's quota repository as this module reads it (store/quotas.py)."""

    async def usage_since(self, server_id: str, since_bucket: int) -> list[QuotaUsage]: ...


class ConnectorQuota:
    """One connector's quota: reserve before storing, give back what stored nothing, count what was refused."""

    def __init__(self, server_id: str, window: QuotaWindow, log: Any) -> None:
        self.server_id = server_id
        self.window = window
        self._log = log
        self._spell: QuotaSpell | None = None  # made at the first refusal
        self._refused: dict[str, int] = dict.fromkeys(QUOTAS, 0)  # since the start

    def fits(self, now: int, items: int, size: int) -> bool:
        """Whether `items` more items of `size` body bytes in all fit now (nothing counted)."""
        return self.window.fits(now, items, size)

    def reserve_all(self, now: int, items: int, size: int) -> bool:
        """Reserve `items` items of `size` bytes in all at once if they fit (one check, the usual case); else
        reserve nothing and return False."""
        if not self.window.fits(now, items, size):
            return False
        self.window.reserve_all(now, items, size)
        self._admitted(now)
        return True

    def charge(self, now: int, size: int) -> QuotaRefusal | None:
        """Reserve one item of `size` bytes, or refuse it; log a spell's start and end."""
        refusal = self.window.reserve(now, size)
        if refusal is None:
            self._admitted(now)
            return None
        if self._spell is None:
            self._spell = QuotaSpell()
        self._refused[refusal.quota] += 1
        if self._spell.refusal(now, refusal.quota):
            limits = self.window.limits
            self._log.warning("connector.quota_reached", connector=self.server_id, quota=refusal.quota,
                              limit=limits.max_items if refusal.quota == "items" else limits.max_bytes,
                              retry_after_ms=refusal.retry_after_ms)
        return refusal

    def release(self, at: int, size: int) -> None:
        """Give back an item reserved at `at` that stored nothing (a redelivery, a failed commit)."""
        self.window.release(at, size)

    def statistics(self, now: int) -> dict[str, int | bool]:
        """Its usage over the sliding hour, its limits, its refusals since the start, and whether in a spell."""
        items, size = self.window.usage(now)
        limits = self.window.limits
        return {"items": items, "bytes": size, "maxItems": limits.max_items, "maxBytes": limits.max_bytes,
                "refusedItems": self._refused["items"], "refusedBytes": self._refused["bytes"],
                "reached": self._spell is not None and self._spell.active}

    def _admitted(self, now: int) -> None:
        if self._spell is not None and self._spell.admission(now):
            self._log.info("connector.quota_ended", connector=self.server_id,
                           **{f"refused_{quota}": self._spell.refused[quota] for quota in QUOTAS})


class ConnectorQuotas:
    """The quota of every connector heard from, by its configured name."""

    def __init__(self, usage: UsageReader, log: Any, limits: Mapping[str, QuotaLimits] | None = None) -> None:
        self._usage = usage
        self._log = log
        self._limits = dict(limits or {})  # a connector not named has the defaults
        self._quotas: dict[str, ConnectorQuota] = {}
        self._loading: dict[str, anyio.Event] = {}

    def get(self, server_id: str) -> ConnectorQuota | None:
        """The connector's quota if it was seeded already (no wait: the usual case)."""
        return self._quotas.get(server_id)

    async def of(self, server_id: str, now: int) -> ConnectorQuota:
        """The connector's quota; the first request of a connector seeds it from the store."""
        quota = self._quotas.get(server_id)
        if quota is not None:
            return quota
        loading = self._loading.get(server_id)
        if loading is not None:  # a concurrent first request: reserve nothing before the seed is in
            await loading.wait()
            return await self.of(server_id, now)
        loading = self._loading[server_id] = anyio.Event()
        try:
            usage = await self._usage.usage_since(server_id, oldest_bucket(now))
            window = QuotaWindow(self._limits.get(server_id, QuotaLimits()), usage)
            quota = self._quotas[server_id] = ConnectorQuota(server_id, window, self._log)
        finally:
            del self._loading[server_id]
            loading.set()
        return quota

    def forget(self, server_id: str) -> None:
        """Drop the connector's hour (not its limits): its next request seeds it from the store again.

        On a store hosts share, the hour a host counted is stale once another host ran the connector
        (docs/operations.md#quotas): the host that takes a connector over forgets it first. Refusal
        counts and a spell in progress go with it (they are this host's, since it took the connector).
        """
        self._quotas.pop(server_id, None)

    def set_limits(self, limits: Mapping[str, QuotaLimits]) -> None:
        """New per-connector limits (a reload): they apply to the next item; the hour's counts are kept."""
        self._limits = dict(limits)
        for server_id, quota in self._quotas.items():
            quota.window.limits = self._limits.get(server_id, QuotaLimits())

    def statistics(self, now: int) -> dict[str, dict[str, int | bool]]:
        """Per connector heard from: `ConnectorQuota.statistics`."""
        return {server_id: quota.statistics(now) for server_id, quota in self._quotas.items()}
