"""The counters and gauges, read from the components' own counts at each scrape (no second bookkeeping).

Every value comes from the object that owns the fact, read when Prometheus
asks, so a scrape says exactly what the store and `mcplhost status` say
(docs/operations.md#metrics):

- items: what the store did (ingest's `item_counts()`: accepted,
  duplicate) and what the connector was told was refused (each handle's
  `refusals.items`, mcplhost/protocol/counts.py);
- refusals and restarts: the connector handles (`refusals.requests`,
  `statistics().restarts`), across process lives;
- publishes: each outbox sender's `stats`; the pending outbox: the store,
  read before each scrape (`refresh`);
- peer admissions: the peer service's `admissions`;
- suppressed log lines: the host's `SuppressedTotals` (mcplhost/logs.py);
- quota refusals: ingest's `quota_statistics()` (refusedItems, refusedBytes);
- turns by outcome: the turns ledger, read before each scrape (metrics/turns.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mcplhost.ingest import Ingest
from mcplhost.logs import SuppressedTotals
from mcplhost.protocol import errors
from mcplhost.protocol.ports import SERVING
from mcplhost.speech.outbox import OutboxSender
from mcplhost.supervisor.handle import ConnectorHandle

#: The lanes `mcplhost_items_total` reports (console input is no connector's).
LANES = ("channels/incoming", "push/event")
#: The outcomes of `outbox.stats` that are publish outcomes (a sender crash is not one).
PUBLISH_OUTCOMES = ("delivered", "retried", "failed")

#: The `reason` label of a refused request: the name of its JSON-RPC error code (a bounded set).
REFUSAL_REASONS: Mapping[int, str] = {
    errors.PARSE_ERROR: "parse_error",
    errors.INVALID_REQUEST: "invalid_request",
    errors.METHOD_NOT_FOUND: "method_not_found",
    errors.INVALID_PARAMS: "invalid_params",
    errors.INTERNAL_ERROR: "internal_error",
    errors.FEATURE_SET_NOT_ENABLED: "feature_set_not_enabled",
    errors.CAPABILITY_DENIED: "capability_denied",
    errors.FEATURE_SET_NOT_DECLARED: "feature_set_not_declared",
    errors.CHECKPOINT_NOT_FOUND: "checkpoint_not_found",
    errors.CHANNEL_NOT_PERMITTED: "channel_not_permitted",
    errors.UNKNOWN_CHANNEL: "unknown_channel",
    errors.CHANNEL_OPEN_FAILED: "channel_open_failed",
}


def refusal_reason(code: int) -> str:
    """The `reason` label for a JSON-RPC error code: its name, or `code_N` for one without a name."""
    return REFUSAL_REASONS.get(code, f"code_{code}")


class HostCollector(Collector):
    """Every counter and gauge of one host, built at each `collect()` from its components."""

    def __init__(self, *, connectors: Mapping[str, ConnectorHandle], ingest: Ingest,
                 outbox_senders: Mapping[str, OutboxSender], peer_admissions: Callable[[], Mapping[str, int]],
                 suppressed: SuppressedTotals) -> None:
        self._connectors = connectors
        self._ingest = ingest
        self._senders = outbox_senders
        self._peer_admissions = peer_admissions
        self._suppressed = suppressed
        #: Pending outbox rows as the store said at the last `refresh` (the store is read off the scrape's path).
        self.outbox_pending = 0
        #: Finished turns by (agent, outcome) as the ledger said before this scrape (metrics/turns.py).
        self.turns: Mapping[tuple[str, str], int] = {}

    def describe(self) -> Iterator[Metric]:
        return iter(())  # nothing to check at registration: the families are built at each collect

    def collect(self) -> Iterator[Metric]:
        yield self._items()
        yield self._refusals()
        up = GaugeMetricFamily("mcplhost_connector_up", "1 while the connector serves (ready or mcp_only).",
                               labels=["connector"])
        restarts = CounterMetricFamily("mcplhost_connector_restarts",
                                       "Restarts performed since the host started (status's restarts).",
                                       labels=["connector"])
        for name, handle in self._connectors.items():
            stats = handle.statistics()
            up.add_metric([name], 1 if stats.state in SERVING else 0)
            restarts.add_metric([name], stats.restarts)
        yield up
        yield restarts
        publishes = CounterMetricFamily("mcplhost_publish", "channels/publish tries by connector and outcome.",
                                        labels=["connector", "outcome"])
        for name, sender in self._senders.items():
            for outcome in PUBLISH_OUTCOMES:
                publishes.add_metric([name, outcome], sender.stats.get(outcome, 0))
        yield publishes
        yield GaugeMetricFamily("mcplhost_outbox_pending", "Publishes in the outbox not yet delivered or failed.",
                                value=self.outbox_pending)
        admissions = CounterMetricFamily("mcplhost_peer_admissions", "Peer messages by admission status.",
                                         labels=["status"])
        for status, count in sorted(self._peer_admissions().items()):
            admissions.add_metric([status], count)
        yield admissions
        suppressed = CounterMetricFamily("mcplhost_log_suppressed",
                                         "Log lines a connector caused that the rate limit counted, not wrote.",
                                         labels=["connector", "event"])
        for (connector, event), count in sorted(self._suppressed.snapshot().items()):
            suppressed.add_metric([connector, event], count)
        yield suppressed
        yield self._quota_refusals()
        turns = CounterMetricFamily("mcplhost_turns", "Agent turns in the ledger by agent and outcome "
                                    "(completed, failed, aborted, held).", labels=["agent", "outcome"])
        for (agent, outcome), count in sorted(self.turns.items()):
            turns.add_metric([agent, outcome], count)
        yield turns

    def _items(self) -> Metric:
        family = CounterMetricFamily("mcplhost_items", "Inbound items by connector, lane and outcome.",
                                     labels=["connector", "lane", "outcome"])
        stored = self._ingest.item_counts()
        for name, handle in self._connectors.items():
            refused = handle.refusals.items
            for lane in LANES:
                family.add_metric([name, lane, "accepted"], stored.get((name, lane, "accepted"), 0))
                family.add_metric([name, lane, "duplicate"], stored.get((name, lane, "duplicate"), 0))
                family.add_metric([name, lane, "refused"], refused.get(lane, 0))
        return family

    def _refusals(self) -> Metric:
        family = CounterMetricFamily("mcplhost_refusals", "Requests refused, by connector, method and reason.",
                                     labels=["connector", "method", "reason"])
        for name, handle in self._connectors.items():
            by_reason: dict[tuple[str, str], int] = {}
            for (method, code), count in handle.refusals.requests.items():
                key = (method, refusal_reason(code))
                by_reason[key] = by_reason.get(key, 0) + count
            for (method, reason), count in sorted(by_reason.items()):
                family.add_metric([name, method, reason], count)
        return family

    def _quota_refusals(self) -> Metric:
        family = CounterMetricFamily("mcplhost_quota_refusals", "Items refused by a connector's quota.",
                                     labels=["connector", "quota"])
        # Ingest's quota check counts them (docs/operations.md#quotas): refusedItems / refusedBytes per connector.
        counts = self._ingest.quota_statistics()
        for name in self._connectors:
            refused = counts.get(name, {})
            family.add_metric([name, "items"], int(refused.get("refusedItems", 0)))
            family.add_metric([name, "bytes"], int(refused.get("refusedBytes", 0)))
        return family
