"""The failure reply: what a failed turn says in its conversation (docs/agents.md#failure-reply).

    operations = failure_reply(agent, speech, at=now)   # [] or one PublishSpeech

With the agent's `failure_reply` set, a turn that ends `failed` and has a
decided route (the wake's default destination) publishes that text there,
as a speech row marked `metadata.failureReply = true` with its outbox row,
in the same write as the turn's end (agents/turns/runner.py), so it is queued once
or not at all. No decided route (several conversations, no conversation, or
the turn failed before its waking items were read): no reply, logged.
"""

from __future__ import annotations

import structlog

from mcplhost.agents.turns.reply import TurnSpeech, publish_operation
from mcplhost.config import AgentConfig
from mcplhost.speech.routing import Destination
from mcplhost.store.operations import PublishSpeech

log = structlog.get_logger()


def failure_reply(agent: AgentConfig, speech: TurnSpeech | None, *, turn_id: int, at: int) -> list[PublishSpeech]:
    """The failed turn's reply as writes: one PublishSpeech to its decided route, or none (logged why)."""
    text = agent.failure_reply
    if not text.strip():
        return []
    destination = speech.default if speech is not None else None
    if not isinstance(destination, Destination):
        log.info("agent.failure_reply_skipped", agent=agent.name, turn=turn_id,
                 reason=getattr(destination, "reason", None) or "no_route_decided")
        return []
    log.info("agent.failure_reply", agent=agent.name, turn=turn_id, connector=destination.server_id,
             channel=destination.channel_id)
    return [publish_operation(agent.name, turn_id, destination, text, at, failure_reply=True)]
