"""Acknowledging waking messages: `channels/acknowledge` (docs/agents.md#typing-and-acknowledge).

An extension, shaped as discord-mcpl 0.1.4 defines it
(docs/mcpl-compat.md#typing-and-acknowledge): the request
`{channelId, messageId, value, intent: "seen"}`, answered
`{acknowledged, representation?, reason?}` (discord-mcpl adds `value` as a
reaction to that message).

With the agent's `ack_reaction` set, each waking item tagged
`chat:addressed` that carries a connector, a channel and a message id gets
one request, when its connector serves and holds `channels.acknowledge`.
The turn only queues them (`Acknowledger.offer`, never blocking: a full
queue drops the request, logged); one worker task sends them, each bounded
by `ACK_TIMEOUT_S`, never retried. A failure or `acknowledged: false` is
logged; a connector that answers -32601 (it does not know the method) is
logged once and not asked again in this run of the host.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

import anyio
import msgspec
import structlog

from mcplhost.agents.tools.outcome import cut_error
from mcplhost.config import AgentConfig
from mcplhost.protocol.ports import REQUEST_FAILURES, AcknowledgePort, State
from mcplhost.protocol.tags import ADDRESSED
from mcplhost.rpc import RemoteError
from mcplhost.store.items import StoredItem

log = structlog.get_logger()

ACKNOWLEDGE = "channels.acknowledge"
ACK_METHOD = "channels/acknowledge"
#: What the host says it acknowledges for: the agent has seen the message (discord-mcpl requires the member).
ACK_INTENT = "seen"
#: The longest one acknowledge may wait for its answer; then it is given up (logged), never retried.
ACK_TIMEOUT_S = 5.0
#: Acknowledgements waiting for the worker; one more is dropped (logged), so a stuck connector costs no memory.
ACK_QUEUE_MAX = 256
#: JSON-RPC's "method not found": the connector does not implement acknowledge.
METHOD_NOT_FOUND = -32601


class Acknowledgement(msgspec.Struct, frozen=True):
    """One `channels/acknowledge` to send: which connector, channel and message, and the reaction."""

    agent: str
    connector: str
    channel_id: str
    message_id: str
    value: str

    def params(self) -> dict[str, str]:
        return {"channelId": self.channel_id, "messageId": self.message_id, "value": self.value,
                "intent": ACK_INTENT}


class AcknowledgeAnswer(msgspec.Struct, frozen=True):
    """The answer as discord-mcpl sends it; members of another shape make it malformed (logged)."""

    acknowledged: bool = False
    representation: str | None = None
    reason: str | None = None


def acknowledgements(agent: AgentConfig, items: Iterable[StoredItem]) -> list[Acknowledgement]:
    """The acknowledgements `agent` sends for its waking `items` (pure): none when `ack_reaction` is empty."""
    value = agent.ack_reaction.strip()
    if not value:
        return []
    found = []
    for item in items:
        meta = item.meta
        connector, channel, message = meta.server_id, meta.channel_id, meta.message_id
        if ADDRESSED in meta.tags and connector and channel and message:
            found.append(Acknowledgement(agent.name, connector, channel, message, value))
    return found


def may_acknowledge(handle: AcknowledgePort | None) -> bool:
    """Whether a connector may be asked `channels/acknowledge` now: it serves and holds channels.acknowledge."""
    return handle is not None and handle.state is State.READY and ACKNOWLEDGE in handle.grant


class Acknowledger:
    """The host's acknowledgements: turns `offer` them, `run` (one task) sends them one at a time."""

    def __init__(self, handles: Mapping[str, AcknowledgePort], *, timeout_s: float = ACK_TIMEOUT_S) -> None:
        self._handles = handles
        self._timeout_s = timeout_s
        self._queue: deque[Acknowledgement] = deque()
        self._wake: anyio.Event | None = None  # made by `run`: set when something is queued
        #: Connectors that answered -32601: not asked again in this run.
        self.unknown: set[str] = set()

    def offer(self, acks: Iterable[Acknowledgement]) -> None:
        """Queue these for the worker; never blocks (a full queue drops, logged)."""
        for ack in acks:
            if ack.connector in self.unknown or not may_acknowledge(self._handles.get(ack.connector)):
                continue
            if len(self._queue) >= ACK_QUEUE_MAX:
                log.warning("agent.acknowledge_dropped", agent=ack.agent, connector=ack.connector,
                            channel=ack.channel_id, messageId=ack.message_id, queued=ACK_QUEUE_MAX)
                continue
            self._queue.append(ack)
        if self._queue and self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Send what is offered, one at a time, until cancelled."""
        while True:
            while self._queue:
                await self.send(self._queue.popleft())
            self._wake = anyio.Event()
            if not self._queue:  # nothing offered since the last check
                await self._wake.wait()

    async def send(self, ack: Acknowledgement) -> bool:
        """One acknowledge, bounded; whether the connector acknowledged it. Never raises (but a cancellation)."""
        handle = self._handles.get(ack.connector)
        if ack.connector in self.unknown or not may_acknowledge(handle):
            return False
        assert handle is not None
        where = {"agent": ack.agent, "connector": ack.connector, "channel": ack.channel_id,
                 "messageId": ack.message_id}
        with anyio.move_on_after(self._timeout_s) as bound:
            try:
                answer = await handle.request(ACK_METHOD, ack.params(), timeout=self._timeout_s,
                                              result_type=AcknowledgeAnswer)
            except RemoteError as exc:
                if exc.code == METHOD_NOT_FOUND:
                    self.unknown.add(ack.connector)
                    log.warning("agent.acknowledge_unknown", **where, detail="not asked again in this run")
                else:
                    log.warning("agent.acknowledge_failed", **where, code=exc.code, error=cut_error(exc.message))
                return False
            except REQUEST_FAILURES as exc:  # a timeout, a connector gone, a malformed answer: logged, never retried
                log.warning("agent.acknowledge_failed", **where, error=cut_error(f"{type(exc).__name__}: {exc}"))
                return False
            if not answer.acknowledged:
                log.info("agent.acknowledge_refused", **where, reason=cut_error(answer.reason or ""))
                return False
            log.info("agent.acknowledged", **where, representation=cut_error(answer.representation or ack.value))
            return True
        if bound.cancelled_caught:
            log.warning("agent.acknowledge_failed", **where, error=f"no answer within {self._timeout_s:g} s")
        return False


def acknowledge_wake(agent: AgentConfig, acknowledger: Acknowledger | None, items: list[StoredItem]) -> None:
    """Offer the acknowledgements of a wake's items (agents/turns/runner.py reads them once for the whole turn)."""
    if acknowledger is not None:
        acknowledger.offer(acknowledgements(agent, items))
