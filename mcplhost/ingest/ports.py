"""What ingest needs from a layer above it, declared here as a Protocol; the host passes the implementation in.

Ingest sits below speech (docs/architecture.md#layers), yet it must
know the host's own delivered publishes to mark their echoes. So it asks
for that knowledge through `EchoPort`, and speech/echoes.py's `EchoMemory`
provides it.
"""

from __future__ import annotations

from typing import Protocol

from mcplhost.inbound.pipeline import Processed
from mcplhost.store.interfaces import Items, Pushes, Quotas


class EchoPort(Protocol):
    """Echo knowledge: whether an inbound item is this host's own delivered publish coming back."""

    async def seed(self, now_ms: int) -> int:
        """Load the recent deliveries from the store (ingest calls it once, before its first item); how many are known."""
        ...

    def marked(self, processed: Processed) -> Processed:
        """`processed` with the echo mark when the item is an echo; `processed` itself when nothing changes."""
        ...


class IngestRepositories(Protocol):
    """The repositories ingest reads beside its writes: a correction's thread and a redelivery (items), a
    push's recorded answer (pushes), each connector's quota use to seed from (quotas); the store is one."""

    @property
    def items(self) -> Items: ...

    @property
    def pushes(self) -> Pushes: ...

    @property
    def quotas(self) -> Quotas: ...
