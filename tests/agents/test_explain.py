"""Explain's decisions (agents/wakes/explain.py): the pure rules table-driven and as properties; the holds recorded when they happen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.agents.wakes.explain import decide, explain_item, is_stop_command_for, static_decision
from mcplhost.agents.wakes.rules import addressing_of, view_of, wake_matches
from mcplhost.agents.wakes.scheduler import HOUR_S, AgentScheduler
from mcplhost.agents.wakes.stop import is_stop_command
from mcplhost.config import AgentConfig, ConnectorConfig
from mcplhost.ingest import now_ms
from mcplhost.store.decisions import WakeDecision
from mcplhost.store.operations import InsertItems, RecordTurn
from mcplhost.store.turns import Turn

from .support import RecordingBackend, agent_config, agent_store, heard
from .test_runtime import running
from .wakes import event

ADDRESSED = ["chat:addressed"]


def agent(**fields: Any) -> AgentConfig:
    fields.setdefault("wake_on", ["addressed"])
    return AgentConfig(name="scout", **fields)


def turn(outcome: str | None, turn_id: int = 9) -> Turn:
    return Turn(id=turn_id, agent="scout", wake_item_ids=[1], started_at=0, ended_at=None, outcome=outcome,
                reason=None, model="m", usage=None, request_digest=None)


STATIC_CASES = [
    # (agent fields, event fields, body, expected)
    ({}, {"tags": ADDRESSED}, "hi", None),
    ({"hears": ["other"]}, {"tags": ADDRESSED}, "hi", ("not_heard", "hears")),
    ({}, {"tags": ["chat:ambient"]}, "hi", ("not_waking", "wake_on")),
    ({}, {"tags": [*ADDRESSED, "chat:from-bot"]}, "hi", ("not_waking", "bot")),
    ({"wake_from_bots": True}, {"tags": [*ADDRESSED, "chat:from-bot"]}, "hi", None),
    ({"wake_from": ["disc/boss"]}, {"tags": ADDRESSED, "author_id": "u1"}, "hi", ("not_waking", "wake_from")),
    ({"wake_from": ["disc/boss"]}, {"tags": ADDRESSED, "author_id": "boss"}, "hi", None),
    ({}, {"tags": ADDRESSED, "echo_of": 3}, "hi", ("not_waking", "echo")),
    ({}, {"tags": [*ADDRESSED, "chat:from-self"]}, "hi", ("not_waking", "echo")),
    ({"control_from": ["disc/boss"]}, {"tags": ADDRESSED, "author_id": "boss"}, " !STOP\n", ("not_waking", "stop_command")),
    ({"control_from": ["disc/boss"]}, {"tags": ADDRESSED, "author_id": "u1"}, "!stop", None),  # an ordinary message
    ({"control_from": ["disc/boss"]}, {"tags": ["chat:ambient"], "author_id": "boss"}, "/stop",
     ("not_waking", "stop_command")),
    ({}, {"tags": ADDRESSED, "agent": "helper"}, "hi", ("not_heard", "hears")),
    ({}, {"tags": ADDRESSED, "agent": "scout"}, "hi", ("not_waking", "own_row")),
]


class TestStaticDecision:
    def test_each_rule_is_named(self) -> None:
        for fields, shape, body, expected in STATIC_CASES:
            view = view_of(event(1, body, **shape))
            assert static_decision(agent(**fields), view, body) == expected, (fields, shape, body)

    @given(st.sampled_from(["all", "addressed", "dm", "push", "disc", "other", "disc/room*"]),
           st.sets(st.sampled_from(["chat:addressed", "chat:private", "chat:from-bot", "chat:from-self"])),
           st.sampled_from([None, ["disc"], ["other"]]), st.sampled_from([None, ["disc/u*"], ["disc/boss"]]),
           st.sampled_from([None, "u1", "boss"]))
    def test_no_static_decision_exactly_when_the_wake_path_would_wake(self, wake_on, tags, hears, wake_from,
                                                                      author) -> None:
        """The same rule as the wake path: explain finds no refusal iff `wake_matches` says it wakes (no stop set)."""
        config = agent(wake_on=[wake_on], hears=hears, wake_from=wake_from)
        view = view_of(event(1, tags=sorted(tags), author_id=author))
        assert (static_decision(config, view, "hello") is None) == wake_matches(config, view)

    def test_an_addressed_item_naming_another_agent_is_not_addressed(self) -> None:
        """Two agents wake on disc's addressed items: `@ada` is not_addressed for scout (docs/agents.md#addressing)."""
        ada = AgentConfig(name="ada", wake_on=["addressed"])
        addressing = addressing_of([ConnectorConfig(name="disc", command=["x"])], [agent(), ada])
        view = view_of(event(1, "@ada only you", tags=ADDRESSED), addressing)
        assert static_decision(agent(), view, "@ada only you", addressing) == ("not_waking", "not_addressed")
        assert static_decision(ada, view, "@ada only you", addressing) is None

    @given(st.text(max_size=12), st.sampled_from(["boss", "u1"]))
    def test_a_stop_command_is_the_sender_and_the_trimmed_case_folded_body(self, body, author) -> None:
        config = agent(control_from=["disc/bo*"])
        view = view_of(event(1, tags=ADDRESSED, author_id=author))
        expected = author == "boss" and body.strip().casefold() in ("!stop", "/stop")
        assert is_stop_command_for(config, view, body) is expected


class TestDecide:
    def test_the_order_turn_then_record_then_held_turn_then_cursor(self) -> None:
        view = view_of(event(5, tags=ADDRESSED))
        capped = WakeDecision(5, "scout", "turn_cap", 0)
        cases = [
            ([turn("completed")], capped, 3, ("woke", None, 9)),  # a turn-capped wake that ran later woke
            ([turn(None)], None, 3, ("woke", None, 9)),  # running
            ([turn("aborted")], None, 9, ("woke", None, 9)),
            ([], capped, 9, ("held", "turn_cap", None)),
            ([turn("held")], None, 9, ("held", "token_budget", None)),
            ([], None, 4, ("held", "pending", None)),
            ([], None, None, ("held", "pending", None)),
            ([], None, 5, ("held", "no_turn", None)),
        ]
        for turns, recorded, cursor, (decision, reason, turn_id) in cases:
            got = decide(agent(), view, "hi", turns=turns, recorded=recorded, cursor=cursor)
            assert (got[0], got[1], got[2] and got[2].id) == (decision, reason, turn_id), (turns, recorded, cursor)

    def test_a_static_rule_wins_over_a_turn(self) -> None:
        """A turn naming an item the config now refuses still says the rule: the rules are the config's."""
        view = view_of(event(5, tags=["chat:ambient"]))
        assert decide(agent(), view, "hi", turns=[turn("completed")], recorded=None, cursor=9)[:2] == (
            "not_waking", "wake_on")


class TestSchedulerReports:
    def test_sender_cap_holds_are_reported_once_each(self) -> None:
        s = AgentScheduler(agent(max_wakes_per_sender_per_hour=1))
        assert s.on_item(event(1, tags=ADDRESSED, author_id="u1"), 0.0)
        assert not s.on_item(event(2, tags=ADDRESSED, author_id="u1"), 1.0)
        assert not s.on_item(event(3, tags=["chat:ambient"], author_id="u1"), 2.0)  # not waking: no record
        assert s.take_decisions() == [(2, "sender_cap")] and s.take_decisions() == []

    def test_turn_cap_holds_are_reported_once_per_spell_and_the_wake_still_runs(self) -> None:
        s = AgentScheduler(agent(debounce_ms=0, max_turns_per_hour=1))
        s.on_item(event(1, tags=ADDRESSED), 0.0)
        assert s.due(0.0) is not None
        s.turn_ended(1.0)
        s.on_item(event(2, tags=ADDRESSED), 2.0)
        assert s.due(2.0) is None
        s.on_item(event(3, tags=ADDRESSED, author_id="u2"), 3.0)
        assert s.due(3.0) is None
        assert s.take_decisions() == [(2, "turn_cap"), (3, "turn_cap")]
        wake = s.due(HOUR_S)
        assert wake is not None and wake.item_ids == (2, 3) and s.take_decisions() == []


async def decisions_of(store: Any, item_id: int) -> list[WakeDecision]:
    with anyio.fail_after(10):
        while not (found := await store.decisions.for_item(item_id)):
            await anyio.sleep(0.01)
    return found


class TestRuntimeRecords:
    async def test_a_sender_cap_hold_is_written_by_the_runtime(self, tmp_path: Path) -> None:
        async with agent_store(tmp_path) as (store, writer, _), \
                running(store, writer, [agent_config(max_wakes_per_sender_per_hour=1)],
                        {"scout": RecordingBackend()}) as (_, ingest):
            first, second = await heard(ingest, "one", "two")
            (decision,) = await decisions_of(store, second)
            assert await store.decisions.for_item(first) == []
        assert (decision.agent, decision.reason) == ("scout", "sender_cap")

    async def test_a_token_budget_hold_records_the_held_wake_s_items(self, tmp_path: Path) -> None:
        async with agent_store(tmp_path) as (store, writer, _):
            now = now_ms()  # a turn of the last day spent the budget
            await writer.submit(RecordTurn("scout", (), now - 1000, now - 900, "completed",
                                           usage={"input_tokens": 50, "output_tokens": 0}))
            async with running(store, writer, [agent_config(max_tokens_per_day=10)],
                               {"scout": RecordingBackend()}) as (_, ingest):
                (item,) = await heard(ingest, "costly")
                (decision,) = await decisions_of(store, item)
        assert (decision.agent, decision.reason) == ("scout", "token_budget")


class TestExplainItem:
    async def test_a_stored_stop_command_is_read_without_its_source_header(self, tmp_path: Path) -> None:
        """The item as the real pipeline stores it (header block first): the sender's words decide, not the header."""
        stored = event(1, " !STOP ", tags=ADDRESSED, author_id="boss")
        assert len(stored.item.content) > 1  # the host's header block, then the body
        async with agent_store(tmp_path) as (store, writer, _):
            written = await writer.write(InsertItems([stored.item]))
            (answer,) = await explain_item(store, [agent(control_from=["disc/boss"])], written[0].id)
        assert (answer.decision, answer.reason) == ("not_waking", "stop_command")

    async def test_a_stop_split_over_two_blocks_is_no_stop_here_as_for_the_runner(self, tmp_path: Path) -> None:
        """Explain reads the body as the stop path does (blocks joined by newlines), so "!st" + "op" is no stop
        command for explain either: it agrees with `is_stop_command`, which the runner asks."""
        stored = event(1, "!st", tags=ADDRESSED, author_id="boss")
        split = msgspec.structs.replace(stored.item, content=[*stored.item.content, {"type": "text", "text": "op"}])
        config = agent(control_from=["disc/boss"])
        assert not is_stop_command(config, split)
        async with agent_store(tmp_path) as (store, writer, _):
            written = await writer.write(InsertItems([split]))
            (answer,) = await explain_item(store, [config], written[0].id)
        assert answer.reason != "stop_command"
