"""The failure reply (docs/agents.md#failure-reply) against a real host, a real connector and the local model server.

The model's server answers 500 (no SDK retries): the turn fails, its
`turn-failed` notice is stored, and with `failure_reply` set one speech row
marked `failureReply` goes through the outbox into the waking conversation.
Through `mcplhost run`, with the reply received by the connector and the
reason in `turns --json`: tests/e2e/test_agents.py's failing-backend test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ..builders import incoming, message
from ..harness import wait_for
from ..memory_pair import memory_host
from .llm_server import LlmServer, Reply
from .test_stop import ASKED, ROOM, host_config, published_texts, scout, until

SORRY = "Sorry, something went wrong on my side."
ASKING = incoming(message(ROOM, "m-1", "scout?", **ASKED))


async def failed_turn(store: Any) -> list[Any]:
    return [t for t in await store.turns.list() if t.outcome == "failed"]


class TestFailureReply:
    async def test_a_failed_turn_publishes_the_failure_reply_once_through_the_outbox(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        monkeypatch.setenv("TEST_LLM_KEY", "k")
        with LlmServer(default=Reply.error(500)) as llm:
            config = host_config(tmp_path, [ASKING], scout(llm, failure_reply=SORRY))
            async with memory_host(config) as host:
                (turn,) = await until(lambda: failed_turn(host.store))
                await wait_for(lambda: published_texts(tmp_path))

                async def delivered() -> list[Any]:  # the connector has it; its answer is recorded just after
                    return [r for r in await host.store.outbox.list() if r.state == "delivered"]

                rows = await until(delivered)
                own = await host.store.items.list(agent="scout")
        (row,) = rows
        assert (row.state, row.turn_id, row.channel_id) == ("delivered", turn.id, ROOM)
        assert published_texts(tmp_path) == [SORRY]
        speech = [r for r in own if r.metadata.get("kind") == "speech"]
        assert [(r.content[0]["text"], r.metadata.get("failureReply")) for r in speech] == [(SORRY, True)]
        assert [r.metadata.get("kind") for r in own].count("turn-failed") == 1
        assert turn.reason == "backend_error"  # which side failed, as turns --json shows it

    async def test_an_answer_with_nothing_in_it_fails_the_turn_malformed_with_its_notice_and_reply(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        """No silent empty turn (docs/agents.md#bounds): no text and no tool call is a failed turn, never a
        completed one that says nothing."""
        monkeypatch.setenv("TEST_LLM_KEY", "k")
        with LlmServer(default=Reply(text="")) as llm:
            config = host_config(tmp_path, [ASKING], scout(llm, failure_reply=SORRY))
            async with memory_host(config) as host:
                (turn,) = await until(lambda: failed_turn(host.store))
                await wait_for(lambda: published_texts(tmp_path))
                own = await host.store.items.list(agent="scout")
        assert turn.reason == "backend_error"
        (notice,) = [r for r in own if r.metadata.get("kind") == "turn-failed"]
        assert notice.metadata["reason"] == "malformed"
        assert published_texts(tmp_path) == [SORRY]

    async def test_no_failure_reply_when_it_is_empty(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        monkeypatch.setenv("TEST_LLM_KEY", "k")
        with LlmServer(default=Reply.error(500)) as llm:
            config = host_config(tmp_path, [ASKING], scout(llm, failure_reply=""))
            async with memory_host(config) as host:
                await until(lambda: failed_turn(host.store))
                assert await host.store.outbox.list() == []
                kinds = [r.metadata.get("kind") for r in await host.store.items.list(agent="scout")]
        assert "turn-failed" in kinds and "speech" not in kinds

    async def test_no_failure_reply_without_a_decided_route_and_it_says_so(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        """Two waking items of two conversations (a thread and its channel): no single route, no reply, a log line."""
        monkeypatch.setenv("TEST_LLM_KEY", "k")
        two_places = incoming(message(ROOM, "m-1", "scout?", **ASKED), message(ROOM, "m-2", "scout!", threadId="t-1", **ASKED))
        with LlmServer(default=Reply.error(500)) as llm, capture_logs() as logs:
            config = host_config(tmp_path, [two_places], scout(llm, failure_reply=SORRY))
            async with memory_host(config) as host:
                await until(lambda: failed_turn(host.store))
                assert await host.store.outbox.list() == []
        (skipped,) = [e for e in logs if e["event"] == "agent.failure_reply_skipped"]
        assert skipped["agent"] == "scout"
