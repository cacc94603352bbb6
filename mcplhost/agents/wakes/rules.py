"""Who an item wakes: the static half of the wake rules, as pure functions over a small view of it; and `Wake`.

The scheduler (wakes/scheduler.py) adds what needs state: the per-sender hourly
cap, debounce, single flight and the runaway guard. Everything here reads
host-written fields only (tags after the SPEC §16 closure, the frozen source,
`metadata.authorId`, `metadata.echoOf`), never `metadata.adapter`.

`Wake`, what the scheduler hands out, lives here with the rule that narrows
it when it fires (`without_late_echoes`), so this module never imports the
scheduler.

Decisions beyond the letter of the spec, kept here so they have one home:

- A `surface` item (local console input) is heard only by the agent it is
  typed to (`agent` set to that agent) and always wakes it: typing to an
  agent is the plainest address there is. It has no connector, so `hears`,
  `wake_on` and `wake_from` do not apply to it; the bots rule and the
  per-sender cap do not either (the operator is at the console).
- A peer message delivered between turns (an agent's own `user` row with
  `metadata.peer` and no `turnId`; mcplhost/peers/service.py) wakes the
  agent it was delivered to, and only it; one delivered at a tool boundary
  (with the `turnId` of the turn that read it) wakes no one. The scheduler
  keeps peer wakes apart from other waking items (docs/peers.md#delivery).
- Any other row that belongs to an agent (`agent` set) is never a wake: the
  agent's own rows are in its context but do not wake it, and another
  agent's rows are not even heard.
- `wake_from` names senders, so it governs items that have one: channel
  messages. Such a message wakes only when `connector/authorId` matches an
  entry, so one without an author id never does (fail closed). Pushes have
  no sender and are not gated by it.
- Addressing (docs/agents.md#addressing): a connector is one bot identity,
  so its `chat:addressed` says the bot was addressed, not which agent. With
  `[[connectors]] agent` set, an addressed item of that connector addresses
  that agent only; without it, when several agents hearing the connector
  wake on `addressed`, it addresses the agents its body names
  (mcplhost/connectors/addressing.py), and no other. The `addressed` entry of
  `wake_on` matches only an item that addresses the agent; one that matched
  but for this is refused as `not_addressed`. `Addressing` says which
  connectors have which rule, built from the config (`addressing_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

import msgspec

from mcplhost.config import WAKE_ON_KEYWORDS, AgentConfig, ConnectorConfig, addressed_wakers
from mcplhost.connectors.addressing import addressed_names
from mcplhost.inbound.conversation import conversation_id
from mcplhost.inbound.notice import reader_text
from mcplhost.inbound.source import PUSH_LANE
from mcplhost.ingest import Stored
from mcplhost.protocol.tags import ADDRESSED
from mcplhost.speech.echoes import Lookup, echo_of
from mcplhost.store.items import StoredItem
from mcplhost.store.rows import ChannelSource, HostRow, ItemMeta, PeerMeta

PRIVATE = "chat:private"
FROM_SELF = "chat:from-self"  # the same tag speech/echoes.py marks as an echo at ingest
FROM_BOT = "chat:from-bot"
SURFACE_KIND = "surface"
assert set(WAKE_ON_KEYWORDS) == {"all", "addressed", "dm", "push"}, "wake_on_matches knows these keywords"


class Wake(msgspec.Struct, frozen=True):
    """What one turn is for: the items that woke the agent."""

    item_ids: tuple[int, ...]  # ascending
    overflow: int  # waking items past the scheduler's MAX_PENDING_IDS, counted only
    conversations: tuple[str, ...]  # distinct conversation ids of the kept items (else the first's), sorted
    #: The waking items (overflow included) are not all of one conversation (an item of none, such as
    #: an unscoped push, counts as a place of its own): routing has no one destination.
    several_conversations: bool
    first_at: float  # when the first of them arrived (scheduler time)
    #: Found after the durable cursor at start (catch-up): its turn first waits for its routes (wakes/catchup.py).
    catch_up: bool = False


#: How much of an addressed body is read for the names it addresses (a name past it is not seen).
ADDRESSING_SCAN_CHARS = 100_000


class Addressing(msgspec.Struct, frozen=True):
    """Whom an addressed item of each connector addresses (docs/agents.md#addressing); built by `addressing_of`.

    A connector in neither map: every agent that wakes on `addressed` (one such agent at most, or none).
    """

    speaks_for: dict[str, str] = {}  # connector → the agent its `agent` key names
    by_name: dict[str, tuple[str, ...]] = {}  # connector → the agents an addressed item must name there


#: No connector has a rule: an addressed item addresses every agent (tests, and hosts of one agent per connector).
NO_ADDRESSING = Addressing()


def addressing_of(connectors: Sequence[ConnectorConfig], agents: Sequence[AgentConfig]) -> Addressing:
    """The rules of a config: its connectors' `agent` keys, and the connectors several agents wake on addressed."""
    speaks_for = {c.name: c.agent for c in connectors if c.agent is not None}
    heard = [(agent.name, agent.hears, agent.wake_on) for agent in agents]
    by_name = {}
    for connector in connectors:
        wakers = addressed_wakers(connector.name, heard)
        if connector.agent is None and len(wakers) > 1:
            by_name[connector.name] = tuple(wakers)
    return Addressing(speaks_for=speaks_for, by_name=by_name)


class StoredView(msgspec.Struct, frozen=True, kw_only=True):
    """What the wake rules read of one stored item (built by `view_of`)."""

    id: int
    server_id: str | None  # metadata.serverId (the configured connector name)
    channel_id: str | None
    tags: frozenset[str]
    lane: str | None  # metadata.source.lane
    source_kind: str | None  # metadata.source.kind: channel | unscoped | surface
    agent: str | None  # the agent the row belongs to, None for everyone's items
    participant: str | None  # the sender's display name (never matched by wake_from)
    author_id: str | None  # metadata.authorId
    conversation_id: str | None
    thread_id: str | None
    echo_of: bool  # metadata.echoOf set: the echo of this host's own publish
    accepted_at: int | None  # metadata.source.acceptedAt, host epoch ms
    peer_trigger: bool = False  # a peer message delivered between turns: it wakes the agent it belongs to
    #: The agents an addressed item of a connector in `Addressing.by_name` names; None: not read (see `addresses`).
    named: frozenset[str] | None = None


def view_of(stored: Stored, addressing: Addressing = NO_ADDRESSING) -> StoredView:
    """The view of a `Stored` event (or a stored row turned into one, as catch-up does).

    With `addressing`, an addressed item of a connector whose items are
    addressed by name has its body read for the names (`named`).
    """
    item = stored.item
    meta, source = item.meta, item.meta.source
    server_id = meta.server_id
    tag_set = frozenset(meta.tags)
    named = None
    candidates = addressing.by_name.get(server_id) if server_id is not None else None
    if candidates and ADDRESSED in tag_set and isinstance(item.content, list):
        body = reader_text(item.content, meta.source_header)[:ADDRESSING_SCAN_CHARS]
        named = frozenset(addressed_names(body, candidates))
    return StoredView(
        id=stored.id,
        server_id=server_id,
        channel_id=meta.channel_id,
        tags=tag_set,
        lane=source.lane if source is not None else None,
        source_kind=source.kind if source is not None else None,
        agent=item.agent,
        participant=item.participant,
        author_id=meta.author_id,
        conversation_id=item.conversation_id,
        thread_id=item.thread_id,
        echo_of=meta.echo_of is not None and meta.echo_of is not False,
        accepted_at=source.accepted_at if source is not None else None,
        peer_trigger=is_peer_trigger(item.agent, item.role, item.host),
        named=named,
    )


def is_peer_trigger(agent: str | None, role: str, host: HostRow | None) -> bool:
    """An agent's peer row delivered between turns (no `turnId`): it wakes that agent."""
    return agent is not None and role == "user" and isinstance(host, PeerMeta) and host.between_turns


def _place_matches(entry: str, view: StoredView) -> bool:
    """`NAME` matches every item of connector NAME; `NAME/GLOB` those whose channel id matches GLOB."""
    name, slash, glob = entry.partition("/")
    if view.server_id != name:
        return False
    return not slash or (view.channel_id is not None and fnmatchcase(view.channel_id, glob))


def hears(agent: AgentConfig, view: StoredView) -> bool:
    """Whether the item is in the agent's context at all."""
    if view.source_kind == SURFACE_KIND or view.agent is not None:
        return view.agent == agent.name
    if agent.hears is None:
        return True
    return any(_place_matches(entry, view) for entry in agent.hears)


def is_echo(view: StoredView) -> bool:
    """The echo of this host's own publish: tagged `chat:from-self`, or marked `echoOf` at ingest."""
    return FROM_SELF in view.tags or view.echo_of


def addresses(agent: AgentConfig, view: StoredView, addressing: Addressing) -> bool:
    """Whether an addressed item addresses this agent (the module's docstring, Addressing).

    Fail closed: an item of a by-name connector whose view was built
    without reading its names addresses no one.
    """
    speaks_for = addressing.speaks_for.get(view.server_id) if view.server_id is not None else None
    if speaks_for is not None:
        return speaks_for == agent.name
    if view.server_id in addressing.by_name:
        return view.named is not None and agent.name in view.named
    return True


def wake_on_matches(agent: AgentConfig, view: StoredView, addressing: Addressing = NO_ADDRESSING) -> bool:
    """Whether one `wake_on` entry matches the item."""
    for entry in agent.wake_on:
        if entry == "all":
            return True
        if entry == "addressed" and ADDRESSED in view.tags and addresses(agent, view, addressing):
            return True
        if entry == "dm" and PRIVATE in view.tags:
            return True
        if entry == "push" and view.lane == PUSH_LANE:
            return True
        if entry not in WAKE_ON_KEYWORDS and _place_matches(entry, view):
            return True
    return False


#: Why an item does not wake an agent, as `wake_refusal` names it (docs/agents.md#explain).
REFUSED_HEARS = "hears"  # not heard at all
REFUSED_ECHO = "echo"
REFUSED_WAKE_ON = "wake_on"
REFUSED_NOT_ADDRESSED = "not_addressed"  # addressed, but to another agent (docs/agents.md#addressing)
REFUSED_WAKE_FROM = "wake_from"
REFUSED_BOT = "bot"
REFUSED_OWN_ROW = "own_row"  # an agent's own row that is not a peer message between turns


def sender_refusal(agent: AgentConfig, view: StoredView) -> str | None:
    """`wake_from_bots` (REFUSED_BOT), then `wake_from` (channel messages, by author id); None: the sender may wake it."""
    if FROM_BOT in view.tags and not agent.wake_from_bots:
        return REFUSED_BOT
    if agent.wake_from is None or view.lane == PUSH_LANE:
        return None
    if view.author_id is not None and view.server_id is not None:
        for entry in agent.wake_from:
            name, _, glob = entry.partition("/")
            if name == view.server_id and fnmatchcase(view.author_id, glob):
                return None
    return REFUSED_WAKE_FROM


def wake_refusal(agent: AgentConfig, view: StoredView, addressing: Addressing = NO_ADDRESSING) -> str | None:
    """The rule by which the item does not wake the agent (REFUSED_*), before the scheduler's cap and guards; None: it wakes.

    The one statement of the static wake rules: the scheduler asks it through
    `wake_matches`, `mcplhost explain` (agents/wakes/explain.py) for its reason.
    """
    if view.source_kind == SURFACE_KIND:
        if view.agent != agent.name:
            return REFUSED_HEARS
        return REFUSED_ECHO if is_echo(view) else None
    if view.agent is not None:  # an agent's own row, or another agent's: never a wake, but a peer message
        if view.agent != agent.name:
            return REFUSED_HEARS
        return None if view.peer_trigger else REFUSED_OWN_ROW
    if not hears(agent, view):
        return REFUSED_HEARS
    if is_echo(view):
        return REFUSED_ECHO
    if not wake_on_matches(agent, view, addressing):
        addressed_elsewhere = "addressed" in agent.wake_on and ADDRESSED in view.tags
        return REFUSED_NOT_ADDRESSED if addressed_elsewhere else REFUSED_WAKE_ON
    return sender_refusal(agent, view)


def wake_matches(agent: AgentConfig, view: StoredView, addressing: Addressing = NO_ADDRESSING) -> bool:
    """Whether the item wakes the agent, before the scheduler's per-sender cap and guards."""
    return wake_refusal(agent, view, addressing) is None


def _place(meta: ItemMeta) -> str | None:
    """The item's conversation as ingest gave it (a channel's, or a thread's in it); None: of no conversation."""
    if not isinstance(meta.source, ChannelSource) or meta.server_id is None or meta.channel_id is None:
        return None
    return conversation_id(meta.server_id, meta.channel_id, meta.thread_id)


def without_late_echoes(wake: Wake, items: Sequence[StoredItem], delivered: Lookup) -> Wake | None:
    """The wake without its items now known as echoes (checked again when the wake fires).

    An echo can be stored before its publish is answered, so ingest could not
    mark it; `delivered` (the outbox's window) knows it by now. None: no waking
    item is left (a counted-only overflow still wakes: it cannot be checked).
    The conversations become those of the items kept; an overflowed wake keeps
    the scheduler's (routing may only get narrower than it was, never wider).
    """
    echoes = {item.id for item in items if echo_of(item.meta, delivered) is not None}
    if not echoes:
        return wake
    kept = tuple(item_id for item_id in wake.item_ids if item_id not in echoes)
    if not kept and not wake.overflow:
        return None
    if wake.overflow:  # the counted-only items' places are unknown: keep what the scheduler saw
        return msgspec.structs.replace(wake, item_ids=kept)
    places = {_place(item.meta) for item in items if item.id not in echoes}
    return msgspec.structs.replace(wake, item_ids=kept, conversations=tuple(sorted(p for p in places if p is not None)),
                                   several_conversations=len(places) > 1)


def sender_key(view: StoredView) -> str | None:
    """Who sent the item, for `max_wakes_per_sender_per_hour`; None: no sender to count (a push, the console).

    The author id when the connector gave one, else the display name (all a
    connector without ids offers); the two are kept apart by their prefix.
    """
    if view.lane == PUSH_LANE or view.source_kind == SURFACE_KIND or view.server_id is None:
        return None
    if view.author_id is not None:
        return f"{view.server_id}/id:{view.author_id}"
    if view.participant is not None:
        return f"{view.server_id}/name:{view.participant}"
    return None
