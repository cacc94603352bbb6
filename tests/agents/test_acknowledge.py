"""Acknowledging waking addressed items (mcplhost/agents/turns/acknowledge.py, docs/agents.md#typing-and-acknowledge).

The rule is pure (`acknowledgements`); the sender is bounded, never retried,
and stops asking a connector that answered -32601. The end-to-end path over
the discordish stub is tests/e2e/test_discord_interop.py.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from mcplhost.agents.turns.acknowledge import ACK_QUEUE_MAX, Acknowledgement, Acknowledger, acknowledgements
from mcplhost.protocol.ports import State
from mcplhost.rpc import RemoteError
from mcplhost.rpc.messages import ErrorObject
from mcplhost.store.items import StoredItem

from .support import agent_config

CHANNEL = "discord:g1:random"


def item(item_id: int, *, tags: Any = ("chat:addressed", "chat:mention"), message: Any = "m-1",
         channel: Any = CHANNEL, server: Any = "discord") -> StoredItem:
    metadata = {"tags": list(tags) if isinstance(tags, tuple) else tags, "messageId": message, "channelId": channel,
                "serverId": server}
    return StoredItem(id=item_id, agent=None, participant="Bob", role="user", content=[], metadata=metadata,
                      created_at=0)


class AckHandle:
    """An AcknowledgePort (state, grant, request); `answers` are raw JSON results or RemoteError codes."""

    def __init__(self, *answers: Any, grant: frozenset[str] = frozenset({"channels.acknowledge"})) -> None:
        self.state = State.READY
        self.grant = grant
        self.answers = list(answers)
        self.asked: list[dict[str, Any]] = []

    async def request(self, method: str, params: Any = None, *, timeout: float | None = None,
                      result_type: Any = Any) -> Any:
        assert method == "channels/acknowledge"
        self.asked.append(params)
        answer = self.answers.pop(0) if self.answers else b'{"acknowledged": true}'
        if isinstance(answer, int):
            raise RemoteError(ErrorObject(code=answer, message="Method not found"))
        if answer == "hang":
            await anyio.sleep_forever()
        return msgspec.json.decode(answer, type=result_type)


def ack(message: str = "m-1") -> Acknowledgement:
    return Acknowledgement("scout", "discord", CHANNEL, message, "👀")


class TestRule:
    def test_an_addressed_item_with_a_message_and_a_channel_gets_one_trimmed(self) -> None:
        acks = acknowledgements(agent_config(ack_reaction=" 👀 "), [item(1)])
        assert acks == [ack()]
        assert acks[0].params() == {"channelId": CHANNEL, "messageId": "m-1", "value": "👀", "intent": "seen"}

    def test_off_by_default(self) -> None:
        assert acknowledgements(agent_config(), [item(1)]) == []
        assert acknowledgements(agent_config(ack_reaction="   "), [item(1)]) == []

    @given(tags=st.one_of(st.none(), st.just("chat:addressed"), st.lists(st.sampled_from(
               ["chat:ambient", "chat:addressed", "chat:dm", 3]), max_size=3)),
           message=st.one_of(st.none(), st.just(""), st.just("m-9"), st.integers()),
           channel=st.one_of(st.none(), st.just(""), st.just(CHANNEL), st.integers()),
           server=st.one_of(st.none(), st.just(""), st.just("discord")))
    def test_only_what_names_everything_and_is_tagged_addressed(self, tags: Any, message: Any, channel: Any,
                                                                 server: Any) -> None:
        """Hostile metadata never raises; an acknowledgement needs all three ids as strings and the tag in a list."""
        acks = acknowledgements(agent_config(ack_reaction="👀"),
                                [item(1, tags=tags, message=message, channel=channel, server=server)])
        wanted = (isinstance(tags, list) and "chat:addressed" in tags and message == "m-9" and channel == CHANNEL
                  and server == "discord")
        assert acks == ([Acknowledgement("scout", "discord", CHANNEL, "m-9", "👀")] if wanted else [])


class TestSender:
    async def test_acknowledged(self) -> None:
        handle = AckHandle(b'{"acknowledged": true, "representation": "\\ud83d\\udc40"}')
        assert await Acknowledger({"discord": handle}).send(ack()) is True
        assert handle.asked == [ack().params()]

    async def test_unknown_method_is_logged_once_and_never_asked_again(self) -> None:
        handle = AckHandle(-32601)
        acknowledger = Acknowledger({"discord": handle})
        with capture_logs() as logs:
            assert await acknowledger.send(ack("m-1")) is False
            assert await acknowledger.send(ack("m-2")) is False
            acknowledger.offer([ack("m-3")])
        assert len(handle.asked) == 1
        assert [e["event"] for e in logs] == ["agent.acknowledge_unknown"]

    async def test_a_refusal_an_error_and_a_malformed_answer_are_logged_not_retried(self) -> None:
        handle = AckHandle(b'{"acknowledged": false, "reason": "Unknown Message"}', -32000, b'{"acknowledged": 1}')
        acknowledger = Acknowledger({"discord": handle})
        with capture_logs() as logs:
            assert [await acknowledger.send(ack(m)) for m in ("m-1", "m-2", "m-3")] == [False, False, False]
        assert len(handle.asked) == 3
        assert [e["event"] for e in logs] == ["agent.acknowledge_refused", "agent.acknowledge_failed",
                                              "agent.acknowledge_failed"]
        assert logs[0]["reason"] == "Unknown Message"

    async def test_an_unanswered_acknowledge_is_given_up_at_its_bound(self) -> None:
        handle = AckHandle("hang")
        with capture_logs() as logs, anyio.fail_after(5):
            assert await Acknowledger({"discord": handle}, timeout_s=0.05).send(ack()) is False
        assert [e["event"] for e in logs] == ["agent.acknowledge_failed"]

    async def test_without_the_path_nothing_is_asked(self) -> None:
        handle = AckHandle(grant=frozenset({"channels.publish"}))
        acknowledger = Acknowledger({"discord": handle})
        assert await acknowledger.send(ack()) is False
        acknowledger.offer([ack()])
        assert handle.asked == []

    async def test_the_worker_sends_what_is_offered_and_a_full_queue_drops(self) -> None:
        handle = AckHandle()
        acknowledger = Acknowledger({"discord": handle})
        with capture_logs() as logs:
            acknowledger.offer([ack(f"m-{n}") for n in range(ACK_QUEUE_MAX + 2)])
        assert [e["event"] for e in logs] == ["agent.acknowledge_dropped"] * 2
        async with anyio.create_task_group() as tg:
            tg.start_soon(acknowledger.run)
            with anyio.fail_after(5):
                while len(handle.asked) < ACK_QUEUE_MAX:
                    await anyio.sleep(0)
            acknowledger.offer([ack("late")])
            with anyio.fail_after(5):
                while handle.asked[-1]["messageId"] != "late":
                    await anyio.sleep(0)
            tg.cancel_scope.cancel()
        assert len(handle.asked) == ACK_QUEUE_MAX + 1
