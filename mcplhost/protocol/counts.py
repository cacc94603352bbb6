"""One connector's refusal counts for the host's whole run, across its process lives.

Each life's `McplConnection` counts what it refuses in its own `refused`
(that life's statistics) and here too; the connector's handle keeps this
object for the host's life, so a restart never resets what the metrics
report (docs/operations.md#metrics). What the store did with an item
(accepted, duplicate) is ingest's to count; what the connector was told
was refused is counted here, where every answer is built.
"""

from __future__ import annotations


class RefusalCounts:
    """Refused requests by (method, code), and refused items by lane, since the host started."""

    def __init__(self) -> None:
        #: (method, JSON-RPC code) → refused requests; methods the host does not know as UNKNOWN_METHOD.
        self.requests: dict[tuple[str, int], int] = {}
        #: lane → items answered `accepted: false` (channels/incoming) or refused pushes (push/event).
        self.items: dict[str, int] = {}

    def request(self, method: str, code: int) -> None:
        key = (method, code)
        self.requests[key] = self.requests.get(key, 0) + 1

    def item(self, lane: str, count: int = 1) -> None:
        if count:
            self.items[lane] = self.items.get(lane, 0) + count
