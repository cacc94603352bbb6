"""What peer messaging needs of the agents above it: a port the agents runtime implements (docs/architecture.md#ports)."""

from __future__ import annotations

from typing import Literal, Protocol

from mcplhost.store import Stored

#: Whether a target can take a message now: `idle` (a turn starts for it: `accepted`), `busy` (in a turn:
#: `queued`), `inactive` (the host is stopping, or the agent's runner is not running: `not_active`).
Activity = Literal["idle", "busy", "inactive"]


class AgentActivity(Protocol):
    """The agents runtime as peer messaging sees it (mcplhost/agents/runtime.py implements it)."""

    def activity(self, name: str) -> Activity: ...

    def status(self, name: str) -> str:
        """What `task_list` shows of the agent: its scheduler state (idle, debouncing, in_turn) or inactive."""
        ...

    def wake(self, name: str, stored: Stored) -> None:
        """A peer row just delivered outside a turn: offer it to the agent's scheduler (it starts a turn)."""
        ...
