"""The agents runtime built whole from the host's parts: what host.py calls, once.

    runtime = build_agents(config, store, writer, connectors, outbox=senders, hooks=hooks, timings=timings)

Everything the agents share is built here, before the runtime, and handed to
it (docs/architecture.md#agents): the peer service over `Running` (which
agents run, the peers' only view of them), the `[moderation]` moderator, the
`channels/acknowledge` sender, the row cache, the decision recorder, and each
agent's backend. The runtime receives them built and builds only each agent's
runner and tools. `backends` (tests) stands in for the backends the config
would build; an agent it does not name gets the config's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

from mcplhost.agents.agent_loop import Running
from mcplhost.agents.backends.moderator import make_moderator
from mcplhost.agents.model import Backend
from mcplhost.agents.reconfigure import build_backend
from mcplhost.agents.runtime import AgentsRuntime
from mcplhost.agents.turns.acknowledge import Acknowledger
from mcplhost.agents.turns.hooks import HookState
from mcplhost.agents.turns.row_cache import RowCache
from mcplhost.agents.turns.runner import CONTEXT_ROWS
from mcplhost.agents.turns.turn_services import AgentConnector, NoTimings, TurnDeps, TurnTimings
from mcplhost.agents.wakes.decision_recorder import DecisionRecorder
from mcplhost.config import Config, api_key_places
from mcplhost.ingest import now_ms
from mcplhost.peers.service import PeerService
from mcplhost.speech.outbox import OutboxSender
from mcplhost.store import Store
from mcplhost.store.hosts import Sharing
from mcplhost.store.writer import GroupWriter


def _owns_agent(sharing: Sharing, name: str) -> bool:
    return name in sharing.agents


def build_agents(config: Config, store: Store, writer: GroupWriter, handles: Mapping[str, AgentConnector], *,
                 backends: Mapping[str, Backend] | None = None, clock_ms: Callable[[], int] = now_ms,
                 outbox: Mapping[str, OutboxSender] | None = None, hooks: HookState | None = None,
                 timings: TurnTimings | None = None, sharing: Sharing | None = None,
                 elsewhere: Callable[[str], bool] | None = None) -> AgentsRuntime:
    """The runtime of `config.agents` over the host's store, writer and connectors, every shared part built.

    `sharing`: this host's part in a shared PostgreSQL store (store/hosts.py), when it has one; the peers
    deliver only to the agents it owns (peers/service.py). `elsewhere`: whether another host runs a
    connector (speech/routing.py `elsewhere_view`).
    """
    shared = sharing is not None
    is_local_agent = None if sharing is None else partial(_owns_agent, sharing)
    running = Running()
    peers = PeerService(config.agents, store, writer, activity=running, clock_ms=clock_ms, shared=shared,
                        is_local_agent=is_local_agent)
    deps = TurnDeps(
        store=store, writer=writer, handles=handles,
        rows=RowCache(store.items, CONTEXT_ROWS, store.secrets),  # one for every agent: everyone's rows are the same rows
        clock_ms=clock_ms, outbox=outbox if outbox is not None else {},
        hooks=hooks if hooks is not None else HookState(),  # the host's (its connectors' inference/request asks it)
        peers=peers, timings=timings if timings is not None else NoTimings(),
        # `[moderation]`'s one checker for every agent (docs/agents.md#moderation), closed when the runtime ends.
        moderator=make_moderator(config.moderation, withheld=frozenset(name for _, name in api_key_places(config))),
        acknowledger=Acknowledger(handles),  # one for every agent: -32601 is remembered per connector
    )
    if elsewhere is not None:
        deps = replace(deps, elsewhere=elsewhere)
    given = backends or {}
    built = {agent.name: given.get(agent.name) or build_backend(f"agents[{i}].backend", agent.backend)
             for i, agent in enumerate(config.agents)}
    return AgentsRuntime(config, deps, built, peers=peers, running=running,
                         recorder=DecisionRecorder(writer, clock_ms), sharing=sharing)
