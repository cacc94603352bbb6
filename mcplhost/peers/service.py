"""Peer messaging at run time: admission, the durable sealed queue, delivery (docs/peers.md).

    peers = PeerService(config.agents, store, writer, activity=running)   # agents/agent_loop.py `Running`
    delivered = await peers.start()                        # reload throttles and counts; deliver what waits
    sent = await peers.send("scout", "lead", "found it", None)   # sent.answer: a task_send_message result
    await peers.deliver_at_tool_boundary("lead", turn_id, conversation)
    delivered = await peers.deliver_queued("lead")         # at the end of lead's turn

Delivery returns the rows it stored as values (`Stored`); the caller, the
agents runtime, wakes their agents (`stored.item.agent`): the service only
asks the runtime who is idle or busy (peers/ports.py), never calls it back.

Admission runs the guards in docs/peers.md's order, all of them and the
enqueue under one lock per target, so two concurrent sends cannot both slip
past a limit: scope (tree.py), the target's activity, then, for peer and
ancestor sends only (an ancestor's guidance is exempt), the throttles
(admission.py), the queue cap and the consecutive-wake cap. An admitted
message is written to SQLite before its sender is answered: `accepted`
(the target is idle; its row is stored in the same commit and wakes it) or
`queued` (the target is in a turn; `Sent.delivered` is then None). A
refusal writes nothing and counts toward no window.

Delivery stores each queued entry as one row of the target's (its envelope,
or the guidance text), never merged with another entry or with other input,
and marks the entry delivered in the same commit, only if it was still
queued: exactly once, also across a crash. `tool-end` entries go in at the
target's next tool boundary (the model reads them in that turn); whatever
is left goes in when the turn ends, and wakes the target again. At start,
every entry still queued is delivered the same way.

The windows, the duplicate window and the consecutive-wake count are kept
in memory for speed and in SQLite for truth: the throttles are reloaded
from the sends of the last LONGEST_WINDOW_MS, the counts from their table.

Hosts sharing a PostgreSQL store (`shared=True`, docs/peers.md#across-hosts):
admission reads the target's sends, queue and wake count from the store
(`store.peers.to_target`, one read per send), so a limit holds whichever
hosts the senders run on. A target this host does not run
(`is_local_agent` False) is always `queued`: the host that runs it delivers
the entry, told by the store's notification (`heard`) or finding it every
SHARED_DELIVERY_POLL_S (`deliver_shared`), when the target is idle; a busy
target takes it at its tool boundary or turn end as always.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import msgspec
import structlog
from msgspec import UNSET

from mcplhost.config import AgentConfig
from mcplhost.peers.admission import Throttles, Verdict, text_key
from mcplhost.peers.envelope import envelope, guidance
from mcplhost.peers.limits import LONGEST_WINDOW_MS, MESSAGE_MAX_CHARS
from mcplhost.peers.loops import Cause, next_count
from mcplhost.peers.ports import AgentActivity, PeerRepositories
from mcplhost.peers.tree import SCOPES, SENDER_RELATIONSHIP, Relation, Tree
from mcplhost.store import NewItem, Stored, now_ms
from mcplhost.store.operations import DeliverPeerMessages, EnqueuePeerMessage, SetPeerWakeCounts
from mcplhost.store.own_rows import text_content
from mcplhost.store.peers import PeerEntry, QueuedPeerMessage, with_entry_id
from mcplhost.store.rows import PeerFrom, PeerMeta, row_metadata
from mcplhost.store.writer import GroupWriter

log = structlog.get_logger()

DISPATCHES = ("tool-end", "turn-end")
#: Sends reloaded at start to seed the throttles: every pair and target at its limit is far fewer.
SEED_SENDS = 100_000
#: Queued entries delivered per read (a target holds at most QUEUE_MAX peer entries, plus guidance).
DELIVER_PAGE = 100
#: On a shared store, one target's sends read per admission: its windows admit far fewer (peers/limits.py).
TARGET_SENDS_READ = 1_000
#: On a shared store, how often the entries queued for this host's idle agents are looked for anyway.
SHARED_DELIVERY_POLL_S = 1.0


class PeerRefusal(Exception):
    """Arguments the tool cannot take (not a refusal status): said to the model as a failed call."""


class Sent(msgspec.Struct, frozen=True):
    """`task_send_message`'s answer, and the row it stored for an idle target (`accepted`): the caller wakes it."""

    answer: dict[str, Any]
    delivered: Stored | None = None


class PeerService:
    """The host's peer messaging: one per host, shared by its agents."""

    def __init__(self, agents: Sequence[AgentConfig], store: PeerRepositories, writer: GroupWriter, *,
                 activity: AgentActivity, clock_ms: Callable[[], int] = now_ms, shared: bool = False,
                 is_local_agent: Callable[[str], bool] | None = None) -> None:
        self.store = store
        #: Several hosts share the store: admission counts from the store, and `deliver_shared` runs.
        self.shared = shared
        #: Whether this host runs the agent (None: every configured agent; the agents' ownership says so once built).
        self.is_local_agent = is_local_agent or _every_agent
        self._heard = anyio.Event()
        self.writer = writer
        self.activity = activity
        self.clock_ms = clock_ms
        self.throttles = Throttles()
        self._locks: dict[str, anyio.Lock] = {}  # one admission lock per target
        self.retree(agents)
        self._queued: dict[str, int] = {}  # target → queued peer entries (guidance not counted)
        self._wakes: dict[str, int] = {}  # target → consecutive agent-caused turns
        #: Admissions by status since start, for status and metrics.
        self.admissions: dict[str, int] = {}

    def retree(self, agents: Sequence[AgentConfig]) -> None:
        """The agents and their parents and titles (at construction, and after a config reload)."""
        self.tree = Tree(agents)
        for agent in agents:
            self._locks.setdefault(agent.name, anyio.Lock())

    # --- start -----------------------------------------------------------------------

    async def start(self) -> list[Stored]:
        """Reload the throttles, queue counts and wake counts from SQLite, then deliver what still waits: the rows
        delivered, each to wake its agent (`item.agent`)."""
        since = self.clock_ms() - LONGEST_WINDOW_MS
        sends = await self.store.peers.recent_sends(since, limit=SEED_SENDS)
        self.throttles.seed((s.sender, s.target, s.text_key, s.created_at) for s in sends)
        self._queued = dict(await self.store.peers.queued_counts())
        self._wakes = dict(await self.store.peers.wake_counts())
        delivered: list[Stored] = []
        for target in await self.store.peers.queued_targets():
            if target in self.tree and self.is_local_agent(target):
                rows = await self.deliver_queued(target)
                log.info("peer.delivered_at_start", agent=target, messages=len(rows))
                delivered += rows
        return delivered

    # --- the tools -------------------------------------------------------------------

    def listing(self, caller: str, scope: Any) -> list[dict[str, Any]]:
        """`task_list`: the caller's descendants (default) or its whole tree."""
        if scope is None:
            scope = "descendants"
        if scope not in SCOPES:
            raise PeerRefusal(f"task_list: `scope` is one of {', '.join(SCOPES)}")
        return self.tree.listing(caller, scope, self.activity.status)

    async def send(self, sender: str, target: Any, message: Any, dispatch: Any) -> Sent:
        """`task_send_message`: the guards in order, the enqueue; the answer the sending model reads, and the row
        delivered at once to an idle target (the caller wakes it)."""
        if not isinstance(target, str) or not target:
            raise PeerRefusal("task_send_message needs `target`, an agent's name")
        if not isinstance(message, str) or not message.strip():
            raise PeerRefusal("task_send_message needs `message`, a non-empty string")
        if dispatch is not None and dispatch not in DISPATCHES:
            raise PeerRefusal(f"task_send_message: `dispatch` is one of {', '.join(DISPATCHES)}")
        sent = await self._admit(sender, target, message, dispatch)
        answer = sent.answer
        self.admissions[answer["status"]] = self.admissions.get(answer["status"], 0) + 1
        log.info("peer.send", agent=sender, target=target, status=answer["status"], reason=answer.get("reason"),
                 chars=len(message))
        return sent

    async def _admit(self, sender: str, target: str, message: str, dispatch: str | None) -> Sent:
        relation = self.tree.relation(sender, target)
        if relation is None:
            return Sent({"status": "invalid_scope", "target": target})
        if len(message) > MESSAGE_MAX_CHARS:
            return Sent({"status": "refused", "target": target, "reason": "too_long"})
        async with self._locks[target]:
            # Another host's agent: that host delivers it, idle or busy (this one cannot know which).
            state = self.activity.activity(target) if self.is_local_agent(target) else "busy"
            if state == "inactive":
                return Sent({"status": "not_active", "target": target})
            guided = relation == "descendant"  # an ancestor's guidance: exempt from the throttles
            key = text_key(message)
            at = self.clock_ms()
            if not guided:
                verdict = await self._check(sender, target, key, at)
                if verdict.status == "rate_limited":
                    return Sent({"status": "rate_limited", "target": target, "retryAfterMs": verdict.retry_after_ms})
                if verdict.status == "refused":
                    return Sent({"status": "refused", "target": target, "reason": verdict.reason})
            status = "accepted" if state == "idle" else "queued"
            entry = PeerEntry(sender=sender, target=target, relationship=SENDER_RELATIONSHIP[relation],
                              dispatch=dispatch or default_dispatch(relation), text=message, text_key=key,
                              status=status, created_at=at)
            row = self.row(entry, entry_id=None, turn_id=None, conversation_id=None) if status == "accepted" else None
            written = await self.writer.write(EnqueuePeerMessage(entry, row))
            if not guided:
                self.throttles.record(sender, target, key, at)
            delivered = None
            if row is None:
                if not guided:
                    self._queued[target] = self._queued.get(target, 0) + 1
            elif written.item_id is not None:
                _log_delivered(entry, written.item_id, in_turn=False)
                # The row as the store holds it (EnqueuePeerMessage named its entry), not built a second time.
                delivered = Stored(written.item_id, with_entry_id(row, written.entry_id))
            return Sent({"status": status, "target": target}, delivered)

    async def _check(self, sender: str, target: str, key: str, at: int) -> Verdict:
        """The throttles' verdict: from this host's memory, or on a shared store from the store's counts."""
        if not self.shared:
            return self.throttles.check(sender, target, key, at, queued=self._queued.get(target, 0),
                                        consecutive_wakes=self.consecutive_wakes(target))
        counts = await self.store.peers.to_target(target, at - LONGEST_WINDOW_MS, limit=TARGET_SENDS_READ)
        throttles = Throttles()  # every host's sends to the target: the windows hold across hosts
        throttles.seed((s.sender, s.target, s.text_key, s.created_at) for s in counts.sends)
        return throttles.check(sender, target, key, at, queued=counts.queued,
                               consecutive_wakes=counts.consecutive_wakes)

    # --- delivery ----------------------------------------------------------------------

    def row(self, entry: PeerEntry | QueuedPeerMessage, *, entry_id: int | None, turn_id: int | None,
            conversation_id: str | None) -> NewItem:
        """The target's row for one message: its envelope (or guidance), `metadata.peer` saying what it is.

        `turn_id`: delivered inside that turn, at a tool boundary (such a row
        wakes no one: the turn reads it); None: delivered between turns, it
        wakes the target (mcplhost/agents/wakes/rules.py).
        """
        relationship = entry.relationship
        if relationship == "ancestor":
            text = guidance(entry.sender, entry.text)
        else:
            text = envelope(entry.sender, self.tree.title(entry.sender), relationship, entry.text)
        meta = PeerMeta(peer=PeerFrom(sender=entry.sender, relationship=relationship), dispatch=entry.dispatch,
                        peer_message_id=UNSET if entry_id is None else entry_id,
                        turn_id=UNSET if turn_id is None else turn_id,
                        conversation_id=UNSET if conversation_id is None else conversation_id)
        return NewItem(role="user", content=text_content(text), metadata=row_metadata(meta),
                       created_at=self.clock_ms(), agent=entry.target, participant=entry.sender,
                       conversation_id=conversation_id)

    async def deliver_at_tool_boundary(self, agent: str, turn_id: int, conversation_id: str | None) -> list[Stored]:
        """Deliver the agent's queued `tool-end` entries into its running turn; the rows delivered (they wake no
        one: the turn reads them)."""
        if agent not in self._locks:
            return []
        async with self._locks[agent]:
            entries = [e for e in await self.store.peers.queued(agent, limit=DELIVER_PAGE) if e.dispatch == "tool-end"]
            if not entries:
                return []
            return await self._deliver(agent, entries, turn_id=turn_id, conversation_id=conversation_id)

    async def deliver_queued(self, agent: str) -> list[Stored]:
        """Deliver every entry still queued for the agent (its turn ended, or the host started); the rows delivered,
        which the caller offers to the agent (they wake it)."""
        if agent not in self._locks:
            return []
        delivered: list[Stored] = []
        async with self._locks[agent]:
            while entries := await self.store.peers.queued(agent, limit=DELIVER_PAGE):
                delivered += await self._deliver(agent, entries, turn_id=None, conversation_id=None)
                if len(entries) < DELIVER_PAGE:
                    break
        return delivered

    async def _deliver(self, agent: str, entries: list[QueuedPeerMessage], *, turn_id: int | None,
                       conversation_id: str | None) -> list[Stored]:
        """One commit: each entry's row, each entry marked delivered; the rows actually stored (exactly once)."""
        rows = [(e.id, self.row(e, entry_id=e.id, turn_id=turn_id, conversation_id=conversation_id)) for e in entries]
        item_ids = await self.writer.write(DeliverPeerMessages(rows, self.clock_ms()))
        stored = [Stored(item_id, row) for (_, row), item_id in zip(rows, item_ids, strict=True) if item_id is not None]
        counted = sum(1 for e, item_id in zip(entries, item_ids, strict=True)
                      if item_id is not None and e.relationship != "ancestor")
        self._queued[agent] = max(0, self._queued.get(agent, 0) - counted)
        for entry, item_id in zip(entries, item_ids, strict=True):
            if item_id is not None:
                _log_delivered(entry, item_id, in_turn=turn_id is not None)
        return stored

    # --- across hosts (a shared store) ------------------------------------------------------

    def heard(self, target: str) -> None:
        """The store says entries were queued for `target` (on any host): look at this host's queues now."""
        if target in self._locks and self.is_local_agent(target):
            self._heard.set()

    async def deliver_shared(self, wake: Callable[[Stored], None], *,
                             poll_s: float = SHARED_DELIVERY_POLL_S) -> None:
        """Until cancelled: deliver what waits for this host's idle agents, queued by any host; `wake` each row.

        Woken by `heard`, and every `poll_s` anyway, so a lost notification only delays a delivery.
        A failed look (the store) is logged and tried again at the next.
        """
        while True:
            with anyio.move_on_after(poll_s):
                await self._heard.wait()
            self._heard = anyio.Event()
            try:
                for target in await self.store.peers.queued_targets():
                    if target in self._locks and self.is_local_agent(target) \
                            and self.activity.activity(target) == "idle":
                        for row in await self.deliver_queued(target):
                            wake(row)
            except Exception:  # the boundary: the entries stay queued for the next look
                log.error("peer.shared_delivery_failed", exc_info=True)

    # --- the loop breaker --------------------------------------------------------------

    def consecutive_wakes(self, agent: str) -> int:
        return self._wakes.get(agent, 0)

    async def turn_starting(self, agent: str, cause: Cause) -> None:
        """Count a turn about to start by its cause (mcplhost/peers/loops.py), durably when the count moves."""
        before = self._wakes.get(agent, 0)
        after = next_count(before, cause)
        if after == before:
            return
        self._wakes[agent] = after
        await self.writer.write(SetPeerWakeCounts([(agent, after, self.clock_ms())]))

    # --- reporting ---------------------------------------------------------------------

    def queued(self, agent: str) -> int:
        """Queued, undelivered peer messages for the agent (guidance not counted)."""
        return self._queued.get(agent, 0)


def _log_delivered(entry: PeerEntry | QueuedPeerMessage, item_id: int, *, in_turn: bool) -> None:
    log.info("peer.delivered", agent=entry.target, sender=entry.sender, relationship=entry.relationship,
             item=item_id, in_turn=in_turn)


def _every_agent(_name: str) -> bool:
    return True


def default_dispatch(relation: Relation) -> str:
    """To an ancestor at its turn end (often a human-driven agent); to anyone else at its next tool boundary."""
    return "turn-end" if relation == "ancestor" else "tool-end"
