"""A turn's speech: from the model's prose (and `channel_publish`) to rows and outbox entries (docs/agents.md#routing, docs/agents.md#outbox).

    speech = TurnSpeech(agent, deps, turn_id, sources, overflow=..., conversation=...)
    await speech.say(prose)              # prose before a round's tool calls: queued before they run
    operations = await speech.operations(text)  # the final prose, committed with the turn's end
    speech.notify(operations, committed)  # wake the senders once that write is in
    answer = await speech.publish(channel, text, thread)   # the channel_publish tool

The rules are mcplhost.speech's (pure): the default destination from the
wake's frozen sources, `>>> DEST` pins, what is permitted. This module only
turns their segments into typed writes: a routed segment is one
`PublishSpeech` (its speech row and outbox row in one transaction, before
anything is sent), the rest are draft rows followed by one `drafts` notice.
After the write, each destination connector's sender is notified; a sender
missing (its connector not started yet) finds the row when it starts.

No double send: once `channel_publish` reached the default destination,
`route_prose` turns later prose for it into a draft. Bounded: a turn
publishes at most `max_publishes_per_turn` segments, and the same text to
the same destination once (speech/budget.py); past either, prose is a draft
and `channel_publish` a refusal (docs/agents.md#bounds). With `[moderation]`,
every routed segment and every `channel_publish` is checked first; what it
does not allow is a draft with reason `moderation` (docs/agents.md#moderation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog

from mcplhost.agents.turns.agent_rows import draft_row, speech_row
from mcplhost.agents.turns.turn_services import TurnDeps
from mcplhost.config import AgentConfig
from mcplhost.jsonobject import JsonObject
from mcplhost.speech.budget import PublishBudget
from mcplhost.speech.moderation import MODERATION, check_publish, moderated
from mcplhost.speech.notices import drafts_notice
from mcplhost.speech.routing import (
    ChannelView,
    Destination,
    Refused,
    Route,
    channel_views,
    default_destination,
    elsewhere_view,
    resolve,
    route_after,
    route_prose,
)
from mcplhost.speech.withhold import publish_refusal, secret_notice, withhold_secrets
from mcplhost.store.operations import InsertItems, Operation, PublishSpeech
from mcplhost.store.outbox import OutboxEntry
from mcplhost.store.own_rows import notice_row
from mcplhost.store.rows import DraftsNotice, Source
from mcplhost.store.writer import Committed

log = structlog.get_logger()


def publish_operation(agent: str, turn_id: int, destination: Destination, text: str, at: int, *,
                      failure_reply: bool = False) -> PublishSpeech:
    """One publish as a write: the speech row (a failed turn's reply when `failure_reply`) and its outbox entry."""
    row = speech_row(agent, turn_id, text, destination, created_at=at, failure_reply=failure_reply)
    entry = OutboxEntry(agent=agent, turn_id=turn_id, server_id=destination.server_id,
                        channel_id=destination.channel_id, thread_id=destination.thread_id,
                        conversation_id=destination.conversation_id(), text=text, created_at=at)
    return PublishSpeech(speech=row, entries=[entry])


class TurnSpeech:
    """One turn's speech state: its default destination and whether `channel_publish` already reached it."""

    def __init__(self, agent: AgentConfig, deps: TurnDeps, turn_id: int, sources: list[Source | None], *,
                 overflow: bool, conversation: str | None) -> None:
        self.agent = agent
        self.deps = deps
        self.turn_id = turn_id
        self.conversation = conversation  # the wake's one conversation: drafts and notices belong to it
        self.default = default_destination(sources, overflow=overflow)
        self.current: Route = self.default  # where unpinned prose goes: a pin holds for the rest of the turn
        self.published_default = False
        self.queued = 0  # publishes queued so far: a turn that fails later has still said these
        self.budget = PublishBudget(agent.max_publishes_per_turn)  # docs/agents.md#bounds

    @property
    def moderated(self) -> bool:
        """`[moderation]` is on: segments are checked whole, so the turn streams nothing (speech/streaming.py)."""
        return self.deps.moderator is not None

    def views(self) -> list[ChannelView]:
        """The channels the agent hears, as routing sees them now (grant and registrations change)."""
        views = channel_views(self.deps.handles, self.agent.hears)
        return views + elsewhere_view(self.default, views, self.agent.hears, self.deps.elsewhere)

    # --- prose ------------------------------------------------------------------------

    async def operations(self, prose: str) -> list[Operation[Any]]:
        """The writes for `prose`: one PublishSpeech per routed segment, then drafts and their one notice."""
        if not prose.strip():
            return []
        views = self.views()
        segments = route_prose(prose, self.current, views,
                               published_default=self.published_default and self.current == self.default)
        self.current = route_after(prose, self.current, views)  # a pin holds for the rest of the turn (docs/agents.md#pins)
        segments, secret_names = withhold_secrets(segments, self.deps.store.secrets)  # docs/agents.md#secrets
        segments = self.budget.bounded(segments)  # before moderation: what is past the bounds is never checked
        segments = await moderated(self.deps.moderator, segments, self.agent.name)  # after: no secret leaves
        now = self.deps.clock_ms()
        operations: list[Operation[Any]] = []
        drafts = []
        for segment in segments:
            if segment.destination is not None:
                self.budget.spend(segment.destination, segment.text)
                operations.append(self._publish_op(segment.destination, segment.text, now))
            else:
                drafts.append(segment)
        if drafts:
            rows = [draft_row(self.agent.name, self.turn_id, d.text, d.reason or "undecided", created_at=now,
                              conversation_id=self.conversation) for d in drafts]
            rows.append(notice_row(self.agent.name, DraftsNotice(turn_id=self.turn_id),
                                   drafts_notice(drafts, views) + secret_notice(secret_names),
                                   created_at=now, conversation_id=self.conversation))
            operations.append(InsertItems(rows))
            for d in drafts:
                log.info("speech.draft", agent=self.agent.name, turn=self.turn_id, reason=d.reason,
                         chars=len(d.text))
        return operations

    async def say(self, prose: str) -> None:
        """Store `prose` now (routed segments queued, the rest drafts) and wake the senders."""
        operations = await self.operations(prose)
        if operations:
            committed = await self.deps.writer.submit(*operations)
            if self.deps.rows is not None:
                self.deps.rows.feed_committed(operations, committed)
            self.notify(operations, committed)

    def notify(self, operations: Sequence[Operation[Any]], committed: Committed) -> None:
        """Wake the sender of every connector an outbox row of `operations` went to; log each queued publish."""
        senders = self.deps.outbox
        woken: set[str] = set()
        for operation in operations:
            if not isinstance(operation, PublishSpeech):
                continue
            outbox_ids = committed[operation].outbox_ids
            for entry in operation.entries:
                self.queued += 1
                log.info("speech.queued", agent=self.agent.name, turn=self.turn_id, connector=entry.server_id,
                         channel=entry.channel_id, thread=entry.thread_id, outbox=outbox_ids)
                if entry.server_id not in woken and entry.server_id in senders:
                    woken.add(entry.server_id)
                    senders[entry.server_id].notify()

    def _publish_op(self, destination: Destination, text: str, now: int) -> PublishSpeech:
        return publish_operation(self.agent.name, self.turn_id, destination, text, now)

    # --- channel_publish -----------------------------------------------------------------

    async def publish(self, channel: str, text: str, thread: str | None = None) -> JsonObject:
        """`channel_publish`: queue `text` for `channel` (thread optional); the tool's JSON answer."""
        secret = self.deps.store.secrets.find_json([channel, text, thread])
        if secret is not None:  # docs/agents.md#secrets: refused, not sent
            log.info("speech.refused", agent=self.agent.name, turn=self.turn_id, reason="secret", variable=secret)
            return publish_refusal(secret)
        destination = resolve(channel, self.views(), thread=thread)
        if isinstance(destination, Refused):
            log.info("speech.refused", agent=self.agent.name, turn=self.turn_id, reason=destination.reason)
            return {"status": "refused", "reason": destination.reason}
        bound = self.budget.refusal(destination, text)
        if bound is not None:  # docs/agents.md#bounds: the model is told; nothing is stored or sent
            log.info("speech.refused", agent=self.agent.name, turn=self.turn_id, reason=bound)
            return self.budget.answer(bound)
        if not (await check_publish(self.deps.moderator, text, self.agent.name, destination)).allowed:
            await self._keep_refused(text)
            return {"status": "refused", "reason": MODERATION}
        self.budget.spend(destination, text)
        operation = self._publish_op(destination, text, self.deps.clock_ms())
        committed = await self.deps.writer.submit(operation)
        if destination == self.default:
            self.published_default = True  # the closing prose is not sent there again (docs/agents.md#routing)
        self.notify([operation], committed)
        return {"status": "queued", "outboxId": committed[operation].outbox_ids[0]}

    async def _keep_refused(self, text: str) -> None:
        """A `channel_publish` moderation refused, kept as a draft (the tool's answer is the agent's notice)."""
        row = draft_row(self.agent.name, self.turn_id, text, MODERATION, created_at=self.deps.clock_ms(),
                        conversation_id=self.conversation)
        written = await self.deps.writer.write(InsertItems([row]))
        if self.deps.rows is not None:
            self.deps.rows.feed_written([row], written)
