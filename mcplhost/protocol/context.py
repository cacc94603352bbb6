"""What the method handlers and the host-initiated jobs see of their connection.

`McplConnection` (connection.py) provides both; `handlers`, `methods` and
`jobs` name these Protocols instead, so none of them imports the connection
and the package has no import cycle. Each lists only what its side reads
or does: the grant in force is read at every call (it changes in the read
loop), never copied.
"""

from __future__ import annotations

from typing import Any, Protocol

from mcplhost.config import ConnectorConfig
from mcplhost.jsonobject import JsonObject
from mcplhost.logs import LimitedLog
from mcplhost.rpc import Session

from .answers import ListedTool
from .channels import ChannelRegistry
from .counts import RefusalCounts
from .featuresets import FeatureSetState
from .intake import Intake
from .manifest import ManifestChange, ManifestTracker
from .ports import InferenceService, PendingHooks
from .states import Mode


class Served(Protocol):
    """One connection's state as the grant, the registry and the negotiated modes have it now."""

    @property
    def name(self) -> str: ...

    @property
    def session(self) -> Session: ...

    @property
    def log(self) -> Any: ...

    @property
    def limited(self) -> LimitedLog: ...

    @property
    def mode(self) -> Mode: ...

    @property
    def is_ready(self) -> bool: ...

    @property
    def grant(self) -> frozenset[str]: ...

    @property
    def feature_sets(self) -> dict[str, FeatureSetState]: ...

    @property
    def legacy(self) -> bool: ...

    @property
    def registry(self) -> ChannelRegistry: ...

    @property
    def tracker(self) -> ManifestTracker: ...

    def schedule(self, job: str, arg: Any) -> None:
        """Queue host-initiated work (`jobs`); never waits."""

    def list_tools_soon(self) -> None:
        """Queue a `tools/list` while `tools` is granted."""


class Inbound(Served, Protocol):
    """What a method handler (handlers.py) may read and do once the connection authorized its method."""

    @property
    def intake(self) -> Intake: ...

    @property
    def accepted_implies(self) -> dict[str, list[str]] | None: ...

    @property
    def inference(self) -> InferenceService | None: ...

    @property
    def hooks(self) -> PendingHooks: ...

    @property
    def counts(self) -> RefusalCounts: ...

    def warn_once(self, key: str, event: str, **fields: Any) -> None:
        """Log `event` the first time `key` is seen on this connection (bounded)."""

    def count_refusal(self, method: str, code: int) -> None:
        """Count a refused request by method and code (the status socket's exact counts)."""


class Outbound(Served, Protocol):
    """What a host-initiated job (jobs.py) reads of the connection, and the policy moves it may make."""

    @property
    def spec(self) -> ConnectorConfig: ...

    @property
    def offered(self) -> frozenset[str]: ...

    @property
    def manifest(self) -> JsonObject | None: ...

    @property
    def capabilities(self) -> JsonObject: ...

    tools: list[ListedTool] | None

    def adopt_change(self, change: ManifestChange) -> None:
        """Put a re-fetched manifest in force (the grant follows through `send_policy`)."""

    async def send_policy(self, grant: frozenset[str], *, initial: bool) -> Mode:
        """featureSets/update: narrowing applies first, widening at the receipt."""

    def close_by_policy(self, why: str) -> None:
        """A later policy was refused with fallback "close": serve nothing more."""
