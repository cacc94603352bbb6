"""Peer admission and delivery (mcplhost/peers/service.py) over a real SQLite store and group writer.

The agents runtime's side of the port (mcplhost/peers/ports.py) is played by `Agents`: which targets are idle,
busy or inactive is what each guard depends on, so a test sets it; the clock is a list the test moves.
The runtime's own implementation is exercised end to end in tests/peers/test_runtime.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from mcplhost.config import AgentConfig
from mcplhost.peers.envelope import EnvelopePayload, parse_envelope
from mcplhost.peers.limits import (
    CONSECUTIVE_WAKES_MAX,
    DUPLICATE_WINDOW_MS,
    MESSAGE_MAX_CHARS,
    PAIR_MAX,
    PAIR_WINDOW_MS,
    QUEUE_MAX,
    TARGET_MAX,
)
from mcplhost.peers.service import PeerRefusal, PeerService
from mcplhost.store import Store, StoredItem, open_store
from mcplhost.store.writer import GroupWriter

T0 = 1_790_000_000_000
#: lead ─ scout ─ probe, lead ─ writer; solo alone; and enough siblings under lead for the target limit.
AGENTS = [AgentConfig(name="lead", title="Lead"), AgentConfig(name="scout", parent="lead", title="Scout"),
          AgentConfig(name="writer", parent="lead"), AgentConfig(name="probe", parent="scout"),
          AgentConfig(name="solo"), *[AgentConfig(name=f"kid{n}", parent="lead") for n in range(TARGET_MAX + 1)]]


def message_of(row: StoredItem) -> EnvelopePayload:
    """The envelope a peer row holds (its first block's text)."""
    payload = parse_envelope(row.content[0]["text"])
    assert payload is not None
    return payload


class Agents:
    """The runtime's side of the port: each agent's activity as the test sets it (the service only reads it)."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}

    def activity(self, name: str) -> str:
        return self.states.get(name, "idle")

    def status(self, name: str) -> str:
        return {"busy": "in_turn"}.get(self.activity(name), self.activity(name))


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@asynccontextmanager
async def peers_over(db: Path, agents: Agents | None = None,
                     clock: Clock | None = None) -> AsyncIterator[tuple[PeerService, Store, Agents, Clock]]:
    agents, clock = agents or Agents(), clock or Clock()
    async with open_store(db) as store, anyio.create_task_group() as tg:
        writer = GroupWriter(store)
        await tg.start(writer.run)
        service = PeerService(AGENTS, store, writer, activity=agents, clock_ms=clock)
        await service.start()
        yield service, store, agents, clock
        tg.cancel_scope.cancel()


async def send(peers: PeerService, sender: str, target: object, message: object, dispatch: object) -> dict:
    """`task_send_message`'s answer alone (the row an accepted send delivered is `Sent.delivered`)."""
    return (await peers.send(sender, target, message, dispatch)).answer


async def rows_of(store: Store, agent: str) -> list:
    return [item for item in await store.items.list(agent=agent) if "peer" in item.metadata]


class TestScopeAndActivity:
    @pytest.mark.parametrize(("sender", "target"), [("scout", "scout"), ("scout", "solo"), ("solo", "lead"),
                                                    ("scout", "ghost")])
    async def test_self_another_tree_or_an_unknown_name_is_invalid_scope(self, tmp_path, sender, target) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, store, agents, _):
            assert await send(peers, sender, target, "hello", None) == {"status": "invalid_scope", "target": target}
            assert await rows_of(store, target) == []

    @pytest.mark.parametrize("sender", ["scout", "lead"])  # a peer, and an ancestor (guidance) alike
    async def test_an_inactive_target_is_not_active_and_nothing_is_queued(self, tmp_path, sender) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, store, agents, _):
            agents.states["writer"] = "inactive"
            assert await send(peers, sender, "writer", "hello", None) == {"status": "not_active", "target": "writer"}
            assert [row async for row in store.peers.iterate()] == []

    async def test_bad_arguments_are_a_failed_call_not_a_status(self, tmp_path) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, _store, _agents, _):
            for target, message, dispatch in [(None, "hi", None), ("lead", "  ", None), ("lead", 7, None),
                                              ("lead", "hi", "now")]:
                with pytest.raises(PeerRefusal):
                    await send(peers, "scout", target, message, dispatch)
            with pytest.raises(PeerRefusal):
                peers.listing("scout", "everyone")

    async def test_a_message_too_long_is_refused_whole_never_cut(self, tmp_path) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, _store, _agents, _):
            assert await send(peers, "scout", "writer", "x" * MESSAGE_MAX_CHARS, None) == {
                "status": "accepted", "target": "writer"}
            assert await send(peers, "scout", "writer", "y" * (MESSAGE_MAX_CHARS + 1), None) == {
                "status": "refused", "target": "writer", "reason": "too_long"}


class TestDelivery:
    async def test_to_an_idle_sibling_it_is_accepted_stored_as_its_envelope_and_wakes_it(self, tmp_path) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, store, agents, _):
            sent = await peers.send("scout", "writer", "found </mcpl_agent_message> it", None)
            assert sent.answer == {"status": "accepted", "target": "writer"}
            (row,) = await rows_of(store, "writer")
            assert row.role == "user" and row.participant == "scout"
            assert row.metadata["peer"] == {"from": "scout", "relationship": "sibling"} and "turnId" not in row.metadata
            payload = parse_envelope(row.content[0]["text"])
            assert payload == EnvelopePayload("scout", "Scout", "sibling", "found </mcpl_agent_message> it")
            # The row delivered is returned, for the runtime to wake its agent with: the service calls no one.
            stored = sent.delivered
            assert stored is not None and stored.item.agent == "writer"
            assert stored.id == row.id and stored.item.metadata["peerMessageId"] == 1

    async def test_down_the_tree_it_is_guidance_and_up_it_is_an_envelope_from_a_descendant(self, tmp_path) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, store, _agents, _):
            await send(peers, "lead", "probe", "look at [source: x / y] closely", None)
            await send(peers, "probe", "lead", "done", None)
            (guidance,) = await rows_of(store, "probe")
            assert guidance.metadata["peer"] == {"from": "lead", "relationship": "ancestor"}
            assert guidance.content[0]["text"].startswith("Guidance from lead:\n")
            assert "\\[source:" in guidance.content[0]["text"]  # marked: no line of it reads as a header
            (up,) = await rows_of(store, "lead")
            assert message_of(up).relationship == "descendant"

    async def test_to_a_busy_target_it_is_queued_then_delivered_at_a_tool_boundary_or_turn_end(self, tmp_path) -> None:
        """tool-end goes in at the next tool boundary (tagged with the turn: it wakes no one); turn-end waits."""
        async with peers_over(tmp_path / "p.db") as (peers, store, agents, _):
            agents.states["writer"] = "busy"
            assert (await send(peers, "scout", "writer", "now", None))["status"] == "queued"
            assert (await send(peers, "probe", "writer", "later", "turn-end"))["status"] == "queued"
            assert peers.queued("writer") == 2 and await rows_of(store, "writer") == []
            assert [s.item.agent for s in await peers.deliver_at_tool_boundary("writer", 41, "conv_x")] == ["writer"]
            (first,) = await rows_of(store, "writer")
            assert first.metadata["turnId"] == 41 and first.metadata["conversationId"] == "conv_x"
            agents.states["writer"] = "idle"
            (delivered,) = await peers.deliver_queued("writer")
            second = (await rows_of(store, "writer"))[-1]
            assert message_of(second).message == "later" and "turnId" not in second.metadata
            assert delivered.id == second.id and delivered.item.agent == "writer" and peers.queued("writer") == 0

    async def test_queued_entries_stay_sealed_one_row_each_never_merged(self, tmp_path) -> None:
        """Three queued messages from two senders: three rows, each its own envelope and sender, in order."""
        async with peers_over(tmp_path / "p.db") as (peers, store, agents, _):
            agents.states["lead"] = "busy"
            for sender, text in [("scout", "one"), ("writer", "two"), ("scout", "three")]:
                assert (await send(peers, sender, "lead", text, None))["status"] == "queued"
            agents.states["lead"] = "idle"
            assert len(await peers.deliver_queued("lead")) == 3
            rows = await rows_of(store, "lead")
            assert [(message_of(r).sender, message_of(r).message)
                    for r in rows] == [("scout", "one"), ("writer", "two"), ("scout", "three")]
            assert [r.metadata["peer"]["from"] for r in rows] == ["scout", "writer", "scout"]

    async def test_a_delivery_racing_another_stores_each_message_once(self, tmp_path) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, store, agents, _):
            agents.states["lead"] = "busy"
            await send(peers, "scout", "lead", "once", None)
            agents.states["lead"] = "idle"
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(peers.deliver_queued, "lead")
            assert len(await rows_of(store, "lead")) == 1


class TestThrottles:
    async def test_the_pair_limit_answers_rate_limited_with_retry_after_and_the_window_slides(self, tmp_path) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, _store, _agents, clock):
            for n in range(PAIR_MAX):
                assert (await send(peers, "scout", "writer", f"m{n}", None))["status"] == "accepted"
                clock.now += 1000
            refused = await send(peers, "scout", "writer", "one more", None)
            assert refused == {"status": "rate_limited", "target": "writer",
                               "retryAfterMs": PAIR_WINDOW_MS - PAIR_MAX * 1000}
            assert (await send(peers, "probe", "writer", "another sender", None))["status"] == "accepted"
            clock.now = T0 + PAIR_WINDOW_MS  # the first send leaves the window
            assert (await send(peers, "scout", "writer", "again", None))["status"] == "accepted"

    async def test_the_target_limit_counts_every_sender(self, tmp_path) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, _store, _agents, _):
            for n in range(TARGET_MAX):
                assert (await send(peers, f"kid{n}", "scout", "hi", None))["status"] == "accepted"
            assert (await send(peers, f"kid{TARGET_MAX}", "scout", "hi", None))["status"] == "rate_limited"

    async def test_the_same_trimmed_text_is_a_duplicate_within_its_window(self, tmp_path) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, _store, _agents, clock):
            assert (await send(peers, "scout", "writer", "same", None))["status"] == "accepted"
            assert await send(peers, "scout", "writer", "  same\n", None) == {
                "status": "refused", "target": "writer", "reason": "duplicate"}
            clock.now += DUPLICATE_WINDOW_MS
            assert (await send(peers, "scout", "writer", "same", None))["status"] == "accepted"

    async def test_the_queue_cap_refuses_queue_full_and_guidance_is_exempt(self, tmp_path) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, _store, agents, clock):
            agents.states["scout"] = "busy"
            senders = ["probe", "writer", *[f"kid{n}" for n in range(TARGET_MAX)]]
            answers = []
            for sender in senders[:QUEUE_MAX]:  # spread out, so the target window (10 per 60 s) is not what refuses
                answers.append(await send(peers, sender, "scout", f"from {sender}", None))
                clock.now += 7000
            assert {a["status"] for a in answers} == {"queued"} and peers.queued("scout") == QUEUE_MAX
            assert await send(peers, senders[QUEUE_MAX], "scout", "one more", None) == {
                "status": "refused", "target": "scout", "reason": "queue_full"}
            assert (await send(peers, "lead", "scout", "guidance gets through", None))["status"] == "queued"
            assert peers.queued("scout") == QUEUE_MAX  # guidance is not counted

    async def test_the_wake_cap_refuses_needs_attention_until_user_input_resets_it(self, tmp_path) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, _store, _agents, _):
            for _ in range(CONSECUTIVE_WAKES_MAX):
                await peers.turn_starting("writer", "agent")
            assert await send(peers, "scout", "writer", "hi", None) == {
                "status": "refused", "target": "writer", "reason": "needs_attention"}
            assert (await send(peers, "lead", "writer", "guidance is exempt", None))["status"] == "accepted"
            await peers.turn_starting("writer", "user")
            assert (await send(peers, "scout", "writer", "hi", None))["status"] == "accepted"

    async def test_a_refused_send_counts_toward_no_window(self, tmp_path) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, _store, _agents, _):
            for _ in range(3):
                assert (await send(peers, "scout", "writer", "x" * (MESSAGE_MAX_CHARS + 1), None))["status"] == "refused"
            for n in range(PAIR_MAX):
                assert (await send(peers, "scout", "writer", f"m{n}", None))["status"] == "accepted"

    async def test_concurrent_sends_racing_the_pair_limit_admit_exactly_the_limit(self, tmp_path) -> None:
        """Twenty sends at once, one admission lock per target: PAIR_MAX admitted, the rest rate_limited."""
        async with peers_over(tmp_path / "p.db") as (peers, store, agents, _):
            agents.states["writer"] = "busy"
            answers: list[dict] = []

            async def one(n: int) -> None:
                answers.append(await send(peers, "scout", "writer", f"race {n}", None))

            async with anyio.create_task_group() as tg:
                for n in range(20):
                    tg.start_soon(one, n)
            statuses = [a["status"] for a in answers]
            assert statuses.count("queued") == PAIR_MAX and statuses.count("rate_limited") == 20 - PAIR_MAX
            assert len([row async for row in store.peers.iterate(target="writer")]) == PAIR_MAX


class TestRestart:
    async def test_windows_queue_and_wake_count_survive_a_restart(self, tmp_path) -> None:
        """A new service over the same file holds the pair limit, the duplicate, the queue and the wake count."""
        db, clock, agents = tmp_path / "p.db", Clock(), Agents()
        agents.states["writer"] = "busy"
        async with peers_over(db, agents, clock) as (peers, _store, _agents, _):
            for n in range(PAIR_MAX):
                await send(peers, "scout", "writer", f"m{n}", None)
            for _ in range(CONSECUTIVE_WAKES_MAX):
                await peers.turn_starting("lead", "agent")
        clock.now += 1000
        agents.states["writer"] = "busy"  # still busy: start delivers the queue
        async with peers_over(db, agents, clock) as (peers, store, _agents, _):
            assert len(await rows_of(store, "writer")) == PAIR_MAX  # delivered at start, each once
            assert (await send(peers, "scout", "writer", "m0", None))["status"] == "rate_limited"
            assert (await send(peers, "scout", "lead", "hi", None))["reason"] == "needs_attention"
        async with peers_over(db, agents, clock) as (peers, store, _agents, _):
            assert len(await rows_of(store, "writer")) == PAIR_MAX  # a second start delivers nothing again


class TestListing:
    async def test_task_list_shows_the_tree_with_statuses(self, tmp_path) -> None:
        async with peers_over(tmp_path / "p.db") as (peers, _store, agents, _):
            agents.states["lead"] = "busy"
            rows = peers.listing("probe", "tree")
            assert {row["name"]: (row["relationship"], row["status"]) for row in rows}["lead"] == ("ancestor", "in_turn")
            assert [row["name"] for row in peers.listing("scout", None)] == ["probe"]
            assert json.dumps(rows)  # plain JSON for the tool result
