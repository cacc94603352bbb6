"""Which host runs each agent on a shared PostgreSQL store: the agent's ownership lock
(docs/operations.md#several-hosts-on-one-store).

    ownership = Ownership(sharing, running.standby)      # sharing None (SQLite): every agent is this host's
    owned = await ownership.claim(names)                 # the others stand by
    await ownership.stand_by(runner, take_over)          # until its lock is taken, then `take_over(runner)`

Each agent is run by the one live host holding its lock (store/hosts.py
`Sharing`, kind "agent"). An agent another host owns stands by here: it has
a runner, but no task, no offers and no catch-up; its state says `standby`.
When the lock comes free the standby takes it and the runtime takes the
agent over (agents/startup.py `take_over`: the turns the old owner left
open closed, the turn guard seeded, the durable cursor read and caught up
from like a start); a take-over that fails lets the lock go and stands by
again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import structlog

from mcplhost.agents.agent_loop import RECOVER_S, AgentRunner
from mcplhost.store.hosts import Sharing

log = structlog.get_logger()


class Ownership:
    """This host's agents' locks on a shared store, and the set of those standing by (`Running.standby`)."""

    def __init__(self, sharing: Sharing | None, standby: set[str]) -> None:
        self.sharing = sharing
        self.standby = standby

    async def claim(self, names: list[str]) -> list[str]:
        """Take the ownership lock of each agent that is free; the ones another live host owns stand by."""
        if self.sharing is None:
            return names
        owned = []
        for name in names:
            if await self.sharing.try_own(name, kind="agent"):
                owned.append(name)
            else:
                self.standby.add(name)
                log.info("agent.standby", agent=name, owner=await self.sharing.owner_of(name, kind="agent"))
        return owned

    async def stand_by(self, runner: AgentRunner, take_over: Callable[[AgentRunner], Awaitable[None]]) -> None:
        """Wait for the agent's lock (store/hosts.py `Sharing.own`), then `take_over` the agent; a failed take-over
        lets the lock go and stands by again."""
        assert self.sharing is not None
        name = runner.agent.name
        while True:
            self.standby.add(name)
            await self.sharing.own(name, kind="agent")
            try:
                await take_over(runner)
                return
            except Exception:  # a store read or write failed: another host (or this one, later) takes it
                self.standby.add(name)
                log.error("agent.take_over_failed", agent=name, exc_info=True)
                with anyio.CancelScope(shield=True):
                    await self.sharing.release(name, kind="agent")
                await anyio.sleep(RECOVER_S)

    async def let_go(self, name: str) -> None:
        """The agent's runner ended here: no longer standing by, and its lock (if held) released, shielded."""
        self.standby.discard(name)
        if self.sharing is not None:
            with anyio.CancelScope(shield=True):
                await self.sharing.release(name, kind="agent")
