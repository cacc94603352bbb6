"""Bounded model output in a turn (docs/agents.md#bounds): the rules of agents/backends/answer_bounds.py, and a turn on a real store
that gets more tool calls than it runs and more text than it keeps."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.agents.backends import make_backend
from mcplhost.agents.backends.answer_bounds import (
    CUT_FINISH,
    answer_is_empty,
    cut_answer,
    not_run_text,
    split_tool_calls,
)
from mcplhost.agents.model import ModelRequest, ModelResponse, OnText, ToolCall
from mcplhost.agents.turns.runner import run_turn
from mcplhost.config import AgentConfig, problems

from ..builders import text_of, wake_of
from .support import agent_config, agent_store, heard, reply_with_tools, scripted
from .test_turn import own_rows, services

CALL = ToolCall(id="c1", name="channel_list", arguments={"limit": 1})


class TestRules:
    @given(st.text(max_size=40), st.integers(1, 50))
    def test_a_cut_answer_keeps_the_first_max_chars_and_ends_there(self, text: str, limit: int) -> None:
        response = ModelResponse(text=text, tool_calls=[CALL], finish_reason="tool_calls")
        cut = cut_answer(response, limit)
        if len(text) <= limit:
            assert cut is response
        else:
            assert (cut.text, cut.tool_calls, cut.finish_reason) == (text[:limit], [], CUT_FINISH)

    def test_empty_means_no_text_no_blank_only_text_and_no_tool_call(self) -> None:
        assert answer_is_empty(ModelResponse(text=""))
        assert answer_is_empty(ModelResponse(text=" \n\t"))
        assert not answer_is_empty(ModelResponse(text="", tool_calls=[CALL]))
        assert not answer_is_empty(ModelResponse(text="."))

    def test_calls_past_the_limit_are_kept_without_their_arguments(self) -> None:
        calls = [ToolCall(id=f"c{n}", name="channel_publish", arguments={"text": "x" * 1000}) for n in range(5)]
        run, skipped = split_tool_calls(calls, 2)
        assert run == calls[:2]
        assert skipped == [ToolCall(id=c.id, name=c.name, arguments={}) for c in calls[2:]]
        assert split_tool_calls(calls, 16) == (calls, [])

    def test_the_config_keys_have_their_defaults_and_refuse_zero(self) -> None:
        agent = AgentConfig(name="scout")
        assert (agent.max_output_chars, agent.max_tool_calls_per_round) == (100_000, 16)
        raw = {"agents": [{"name": "scout", "max_output_chars": 0, "max_tool_calls_per_round": 0}]}
        assert problems(raw) == ["agents[0].max_output_chars: Expected `int` >= 1",
                                 "agents[0].max_tool_calls_per_round: Expected `int` >= 1"]


class _Recording:
    """The scripted backend, with the requests it was given kept."""

    name = "scripted"

    def __init__(self, agent: AgentConfig) -> None:
        self.inner = make_backend(agent.backend)
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest, *, on_text: OnText | None = None) -> ModelResponse:
        self.requests.append(request)
        return await self.inner.complete(request, on_text=on_text)

    async def aclose(self) -> None:
        await self.inner.aclose()


class TestTurn:
    async def test_only_max_tool_calls_per_round_run_and_each_other_call_reads_not_run(self, tmp_path: Path) -> None:
        """40 calls in one answer, 16 run: all 40 are stored with a result (the history stays valid for every API),
        the 24 others without their arguments and with the not-run result; the next request holds all 40 pairs."""
        calls = [("history_search", {"query": f"q{n}"}) for n in range(40)]
        agent = agent_config(max_tool_calls_per_round=16, backend=scripted(reply_with_tools("", *calls), "done"))
        backend = _Recording(agent)
        async with agent_store(tmp_path) as (store, writer, ingest):
            (item,) = await heard(ingest, "search a lot")
            assert (await run_turn(agent, wake_of(item), *services(agent, store, writer, backend))).outcome == "completed"
            rows = await own_rows(store, "scout")
        stored_calls = [r for r in rows if r.metadata["kind"] == "tool-call"]
        results = {r.metadata["toolCallId"]: r for r in rows if r.metadata["kind"] == "tool-result"}
        assert len(stored_calls) == 40 and len(results) == 40
        refused = [cid for cid, r in results.items() if text_of(r.content) == not_run_text(40, 16)]
        assert refused == [f"scripted-0-{n}" for n in range(16, 40)]
        assert all(results[cid].metadata["isError"] is True for cid in refused)
        second = backend.requests[1].messages
        sent_calls = [c for m in second for c in m.tool_calls]
        assert [c.id for c in sent_calls] == [f"scripted-0-{n}" for n in range(40)]
        assert [c.arguments for c in sent_calls[16:]] == [{}] * 24
        assert sum(1 for m in second if m.role == "tool") == 40

    async def test_an_answer_past_max_output_chars_is_cut_and_the_request_says_the_bound(self, tmp_path: Path) -> None:
        agent = agent_config(max_output_chars=12, backend=scripted("a" * 50))
        backend = _Recording(agent)
        async with agent_store(tmp_path) as (store, writer, ingest):
            (item,) = await heard(ingest, "talk a lot")
            assert (await run_turn(agent, wake_of(item), *services(agent, store, writer, backend))).outcome == "completed"
            rows = await own_rows(store, "scout")
        (draft,) = [r for r in rows if r.metadata["kind"] == "draft"]
        assert text_of(draft.content) == "a" * 12
        assert backend.requests[0].max_output_chars == 12
