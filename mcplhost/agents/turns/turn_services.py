"""What a turn reaches outside itself: the host's parts (`TurnDeps`) apart from one agent's state (`AgentState`).

    deps = TurnDeps(store=store, writer=writer, handles=handles)      # built once by agents/wiring.py
    state = AgentState(backend=backend, toolbox=toolbox)              # one per agent, owned by its runner
    result = await run_turn(agent, wake, deps, state)

`TurnDeps` never changes once built: every agent's turns share it. What a
reload replaces between two turns (the backend, the tools, the prompt, the
connectors without the `from:` line) and what one agent carries from turn to
turn (its held token budget) is its `AgentState`. Its own module so that the
turn and its reply path (agents/turns/reply.py, which runner.py imports) can
name both types.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from mcplhost.agents.model import Backend
from mcplhost.agents.tools.toolbox import ToolBox
from mcplhost.agents.turns.acknowledge import Acknowledger
from mcplhost.agents.turns.hooks import HookState
from mcplhost.agents.turns.row_cache import RowCache
from mcplhost.peers.service import PeerService
from mcplhost.protocol.ports import AcknowledgePort, CatchUpPort, ChannelListing, HookPort, NotifyPort, ToolPort
from mcplhost.speech.moderation import Moderator
from mcplhost.speech.outbox import OutboxSender
from mcplhost.store import Store
from mcplhost.store.writer import GroupWriter


class AgentConnector(HookPort, NotifyPort, AcknowledgePort, ToolPort, ChannelListing, CatchUpPort, Protocol):
    """Each connector as the agents hold it: every port their parts call (hooks, typing and streaming,
    acknowledge, tools, routing, catch-up), since one map of them goes to all (mcplhost/protocol/ports.py)."""


class TurnTimings(Protocol):
    """Where the agents report their timings (the host's metrics implement it, docs/operations.md#metrics)."""

    def wake_started(self, waited_s: float) -> None:
        """A turn starts `waited_s` after its oldest waking item was accepted (the wake latency)."""

    def turn_ended(self, agent: str, outcome: str, seconds: float) -> None:
        """A turn of `agent` ended with `outcome` after `seconds`."""


class NoTimings:
    """Timings reported nowhere (a host without metrics, a turn run on its own)."""

    def wake_started(self, waited_s: float) -> None:
        pass

    def turn_ended(self, agent: str, outcome: str, seconds: float) -> None:
        pass


def _wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, kw_only=True)
class TurnDeps:
    """The host's parts every turn reaches: the store, the writer, the connectors, and the shared services."""

    store: Store  # items, turns and cursors; the reader behind the search tool
    writer: GroupWriter
    handles: Mapping[str, AgentConnector]  # connector name → its ports (the supervisor's handle)
    rows: RowCache | None = None  # the host's shared row cache; None: read the store each time
    clock_ms: Callable[[], int] = _wall_ms
    #: connector name → its outbox sender (speech/outbox.py); `notify()` it after queuing a publish.
    outbox: Mapping[str, OutboxSender] = field(default_factory=dict)
    #: The host's hook and lifecycle bookkeeping (turns/hooks.py), shared by its agents and no other host.
    hooks: HookState = field(default_factory=HookState)
    #: The host's peer messaging (None: a turn run on its own, with no peers to deliver).
    peers: PeerService | None = None
    #: Where the turn's seconds and its wake latency are reported (the host's metrics, or nowhere).
    timings: TurnTimings = field(default_factory=NoTimings)
    #: `[moderation]`'s check of every segment before it is queued (None: no moderation); the host's one, shared.
    moderator: Moderator | None = None
    #: The host's `channels/acknowledge` sender (agents/turns/acknowledge.py; None: a turn run on its own sends none).
    acknowledger: Acknowledger | None = None
    #: Whether another host sharing the store runs the connector (speech/routing.py `elsewhere_view`); one host: never.
    elsewhere: Callable[[str], bool] = field(default=lambda _name: False)


@dataclass(kw_only=True)
class AgentState:
    """One agent's settings in force and what it carries between its turns; its runner alone changes it."""

    backend: Backend
    toolbox: ToolBox
    #: The agent's own prompt, read when the agents are built and again at each reload (docs/operations.md#reload).
    system_prompt: str = ""
    #: The connectors whose items are compiled without the `from:` line (`author_line = false`); a reload
    #: replaces it (runtime.py `AgentsRuntime.set_connectors`), and the next compile reads the new set.
    no_author_line: frozenset[str] = frozenset()
    budget_held: bool = False  # max_tokens_per_day reached and warned about; reset once a call is made again
