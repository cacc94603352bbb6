"""`mcplhost explain ITEM_ID`: per agent, why an item did or did not wake it, and what came of it (docs/agents.md#explain).

The static rules are recomputed from the config by the very function the
wake path asks (`wake_refusal` in agents/wakes/rules.py), so the inbound path writes
nothing for items that do not wake; only the stateful decisions (sender cap,
turn cap, token budget, dropped by a stop) were recorded when they happened
(store/decisions.py). `decide` is pure; `explain_item` reads the ledgers.

The order of the answer, the first that applies:

1. a static rule: `not_heard` (`hears`), or `not_waking` (`echo`,
   `stop_command`, `wake_on`, `not_addressed`, `bot`, `wake_from`,
   `own_row`); for `wake_on` and `not_addressed` the answer also carries
   the item's tags and the agent's `wake_on`, side by side;
2. a turn of the agent whose `wake_item_ids` hold the item and that ran:
   `woke` (a wake held past the turn cap that ran later woke, too);
3. a recorded decision: `held` with its reason;
4. a turn that holds it but was held (`max_tokens_per_day`): `held`,
   `token_budget`;
5. no turn and no decision: `held` with `pending` while the item is above
   the agent's durable cursor (debouncing, behind a running turn, or not
   handled yet), else `no_turn` (it was handled without a turn of its own
   that names it: counted only in an overflowed wake, held as a loop, or
   older than catch_up_max_age_s at a restart).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from mcplhost.agents.wakes.rules import (
    NO_ADDRESSING,
    REFUSED_ECHO,
    REFUSED_HEARS,
    REFUSED_NOT_ADDRESSED,
    REFUSED_OWN_ROW,
    REFUSED_WAKE_ON,
    Addressing,
    StoredView,
    view_of,
    wake_refusal,
)
from mcplhost.agents.wakes.stop import CHANNEL_KIND, MAX_STOP_TEXT_CHARS, command_text, controls, normalized_commands
from mcplhost.config import AgentConfig
from mcplhost.ingest import Stored
from mcplhost.speech.echoes import echo_key
from mcplhost.store import Store
from mcplhost.store.decisions import WakeDecision
from mcplhost.store.outbox import OutboxRow
from mcplhost.store.turns import RAN_OUTCOMES, REASON_TOKEN_BUDGET, Turn, spent_tokens

NOT_HEARD = "not_heard"
NOT_WAKING = "not_waking"
HELD = "held"
WOKE = "woke"
DECISIONS = (NOT_HEARD, NOT_WAKING, HELD, WOKE)

#: Reasons explain adds to the static and recorded ones (docs/agents.md#explain).
REASON_STOP_COMMAND = "stop_command"
REASON_PENDING = "pending"
REASON_NO_TURN = "no_turn"


class TurnSummary(msgspec.Struct, frozen=True):
    id: int
    outcome: str | None  # None while the turn runs
    model: str | None
    tokens: int


class Publish(msgspec.Struct, frozen=True, rename="camel"):
    outbox_id: int
    destination: str  # connector/channel-id
    state: str


class DraftRow(msgspec.Struct, frozen=True):
    id: int  # the draft row's item id
    reason: str | None


#: The reasons an answer shows the item's tags and the agent's `wake_on` for (what the rule compared).
TAGGED_REASONS = (REFUSED_WAKE_ON, REFUSED_NOT_ADDRESSED)


class Explanation(msgspec.Struct, frozen=True):
    """One agent's answer; its JSON encoding is a line of `mcplhost explain --json` (key order included).

    `tags` and `wake_on` (JSON `wakeOn`), added after the documented keys:
    the item's tags and the agent's `wake_on` when the reason is one of
    TAGGED_REASONS, else null.
    """

    agent: str
    item: int
    decision: str
    reason: str | None
    turn: TurnSummary | None
    publishes: list[Publish]
    drafts: list[DraftRow]
    tags: list[str] | None = None
    wake_on: list[str] | None = msgspec.field(default=None, name="wakeOn")


_encoder = msgspec.json.Encoder()


def explanation_line(explanation: Explanation) -> bytes:
    return _encoder.encode(explanation)


def is_stop_command_for(agent: AgentConfig, view: StoredView, body: str) -> bool:
    """`agents/wakes/stop.py`'s rule on an item already read as a view and a header-less body (docs/agents.md#stop).

    `static_decision` has ruled out what is not heard, echoes and agents' rows first.
    """
    if not agent.control_from or view.source_kind != CHANNEL_KIND or len(body) > MAX_STOP_TEXT_CHARS:
        return False
    return controls(agent, view.server_id, view.author_id) and (
        body.strip().casefold() in normalized_commands(agent.stop_commands))


def static_decision(agent: AgentConfig, view: StoredView, body: str,
                    addressing: Addressing = NO_ADDRESSING) -> tuple[str, str] | None:
    """(decision, reason) when a static rule decides the item does not wake the agent; None: it would wake it."""
    refusal = wake_refusal(agent, view, addressing)
    if refusal == REFUSED_HEARS:
        return NOT_HEARD, refusal
    if refusal in (REFUSED_ECHO, REFUSED_OWN_ROW):
        return NOT_WAKING, refusal  # never a wake, whatever else it is
    if view.agent is None and is_stop_command_for(agent, view, body):
        return NOT_WAKING, REASON_STOP_COMMAND
    if refusal is not None:
        return NOT_WAKING, refusal
    return None


def decide(agent: AgentConfig, view: StoredView, body: str, *, turns: Sequence[Turn],
           recorded: WakeDecision | None, cursor: int | None,
           addressing: Addressing = NO_ADDRESSING) -> tuple[str, str | None, Turn | None]:
    """(decision, reason, the turn it woke) for one agent, in the order of the module's docstring."""
    static = static_decision(agent, view, body, addressing)
    if static is not None:
        return static[0], static[1], None
    ran = [turn for turn in turns if turn.outcome is None or turn.outcome in RAN_OUTCOMES]
    if ran:
        return WOKE, None, ran[-1]
    if recorded is not None:
        return HELD, recorded.reason, None
    if turns:
        return HELD, REASON_TOKEN_BUDGET, None
    return HELD, REASON_PENDING if cursor is None or view.id > cursor else REASON_NO_TURN, None


def summary(turn: Turn) -> TurnSummary:
    return TurnSummary(id=turn.id, outcome=turn.outcome, model=turn.model, tokens=spent_tokens(turn.usage))


def publish_of(row: OutboxRow) -> Publish:
    return Publish(outbox_id=row.id, destination=f"{row.server_id}/{row.channel_id}", state=row.state)


def plain_lines(explanation: Explanation) -> list[str]:
    """The plain answer: one line for the agent, then one indented line per publish and per draft."""
    turn = explanation.turn
    if explanation.decision == WOKE and turn is not None:
        lines = [f"{explanation.agent}: woke turn {turn.id} ({turn.outcome or 'running'}, "
                 f"{turn.model or 'no model'}, {turn.tokens} tokens)"]
    elif explanation.tags is not None and explanation.wake_on is not None:
        tags = ", ".join(explanation.tags) or "none"
        lines = [f"{explanation.agent}: {explanation.decision.replace('_', ' ')} ({explanation.reason}; "
                 f"item tags: {tags}; wake_on: {', '.join(explanation.wake_on) or 'none'})"]
    else:
        lines = [f"{explanation.agent}: {explanation.decision.replace('_', ' ')} ({explanation.reason})"]
    lines += [f"  publish {p.outbox_id} → {p.destination}: {p.state}" for p in explanation.publishes]
    lines += [f"  draft {d.id}: {d.reason or 'no reason'}" for d in explanation.drafts]
    return lines


async def explain_item(store: Store, agents: Sequence[AgentConfig], item_id: int,
                       addressing: Addressing = NO_ADDRESSING) -> list[Explanation] | None:
    """Each agent's answer about the stored item, in the order given; None: no item has that id.

    `addressing`: the config's (wakes/rules.py `addressing_of`, over every configured agent, not only those asked about).
    """
    found = await store.items.after_as_written(item_id - 1, limit=1)
    if not found or found[0][0] != item_id:
        return None
    written = found[0][1]
    view = view_of(Stored(item_id, written), addressing)
    key = echo_key(written.meta)
    if not view.echo_of and key is not None and await store.outbox.delivered_as(*key) is not None:
        view = msgspec.structs.replace(view, echo_of=True)  # an echo ingest could not know yet: the ledger does
    # The text the stop rule compares, read as the runner reads it (header dropped; None: too long to be one).
    body = command_text(written.content, written.meta) or ""
    turns = await store.turns.waking(item_id)
    recorded = {decision.agent: decision for decision in await store.decisions.for_item(item_id)}
    cursors = await store.cursors.all()
    answers = []
    for agent in agents:
        decision, reason, turn = decide(agent, view, body, turns=[t for t in turns if t.agent == agent.name],
                                        recorded=recorded.get(agent.name), cursor=cursors.get(agent.name),
                                        addressing=addressing)
        publishes: list[Publish] = []
        drafts: list[DraftRow] = []
        if turn is not None:
            publishes = [publish_of(row) for row in await store.outbox.of_turn(turn.id)]
            drafts = [DraftRow(row_id, why) for row_id, why in await store.items.turn_drafts(agent.name, turn.id)]
        tagged = reason in TAGGED_REASONS
        answers.append(Explanation(agent=agent.name, item=item_id, decision=decision, reason=reason,
                                   turn=None if turn is None else summary(turn), publishes=publishes, drafts=drafts,
                                   tags=sorted(view.tags) if tagged else None,
                                   wake_on=list(agent.wake_on) if tagged else None))
    return answers
