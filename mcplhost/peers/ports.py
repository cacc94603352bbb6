"""What peer messaging needs of the agents above it: a port the agents runtime implements (docs/architecture.md#ports)."""

from __future__ import annotations

from typing import Literal, Protocol

from mcplhost.store.interfaces import Peers

#: Whether a target can take a message now: `idle` (a turn starts for it: `accepted`), `busy` (in a turn:
#: `queued`), `inactive` (the host is stopping, or the agent's runner is not running: `not_active`).
Activity = Literal["idle", "busy", "inactive"]


class AgentActivity(Protocol):
    """The agents as peer messaging sees them: who is idle or busy (mcplhost/agents/agent_loop.py `Running`).

    Read only: a row delivered is returned to the caller, which wakes its
    agent (mcplhost/peers/service.py); the service never calls the agents.
    """

    def activity(self, name: str) -> Activity: ...

    def status(self, name: str) -> str:
        """What `task_list` shows of the agent: its scheduler state (idle, debouncing, in_turn) or inactive."""
        ...


class PeerRepositories(Protocol):
    """The repository the peer service reads (its queue, sends and wake counts); the store is one."""

    @property
    def peers(self) -> Peers: ...
