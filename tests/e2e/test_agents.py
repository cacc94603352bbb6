"""Agents end to end through `mcplhost run`: real stub connectors, the scripted backend, the turns ledger.

docs/agents.md: an arriving item wakes the right agent, its turn runs and is
recorded, and a host killed between an item's commit and its turn wakes the
agent for it on the next start.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

from ..agents.llm_server import LlmServer, Reply
from ..builders import incoming, message
from ..cli.support import cli, daemon, scripted_connector, toml_table, write_config
from ..harness import CHAT_GRANT, CHAT_MANIFEST, alive, record, wait_for

ROOM = "disc:g1:room"
REGISTER = {"request": "channels/register", "params": {"channels": [
    {"id": ROOM, "type": "disc", "direction": "bidirectional", "address": {}, "label": "#room"}]}}


ALICE = {"id": "u-alice", "name": "Alice"}


def said(message_id: str, body: str, tags: list[str]) -> dict[str, Any]:
    """Alice's message in ROOM, as a channels/incoming step."""
    return incoming(message(ROOM, message_id, body, author=ALICE, tags=tags))


def with_agents(config: Path, *agents: tuple[dict[str, Any], dict[str, Any]]) -> Path:
    """Append [[agents]] tables (each with its [agents.backend]) to a config file."""
    text = config.read_text(encoding="utf-8")
    for agent, backend in agents:
        text += "\n" + toml_table("[[agents]]", agent) + toml_table("[agents.backend]", backend)
    config.write_text(text, encoding="utf-8")
    return config


def turns(db: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in cli("turns", "--db", str(db), "--json").stdout.splitlines()]


def agent_rows(db: Path, agent: str) -> list[dict[str, Any]]:
    out = cli("messages", "--db", str(db), "--json", "--agent", agent).stdout
    return [json.loads(line) for line in out.splitlines()]


def finished_turns(db: Path) -> int:
    """Finished turns, read with plain sqlite3 beside the running host (0 while the schema is being made)."""
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT count(*) FROM turns WHERE ended_at IS NOT NULL").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def item_ids(db: Path) -> list[int]:
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [row[0] for row in conn.execute("SELECT id FROM items WHERE agent IS NULL ORDER BY id")]
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


class TestScriptedAgent:
    async def test_an_addressed_message_wakes_the_agent_and_its_echo_is_stored_as_speech(self, tmp_path: Path):
        """Ambient chatter wakes no one; the addressed message does; the speech echoes its body; turns has it."""
        db = tmp_path / "host.db"
        steps = [REGISTER, said("m-1", "weather is nice", ["chat:ambient"]),
                 said("m-2", "scout, say hi", ["chat:addressed"])]
        config = with_agents(
            write_config(tmp_path, [scripted_connector("disc", {"manifest": CHAT_MANIFEST, "steps": steps},
                                                       tmp_path, grant=CHAT_GRANT, restart={"policy": "never"})]),
            ({"name": "scout", "wake_on": ["addressed"], "debounce_ms": 50, "system_prompt": "You are Scout."},
             {"kind": "scripted", "script": ["you said: {{echo}}"]}))
        async with daemon(config, tmp_path) as run:
            await wait_for(lambda: finished_turns(db) >= 1, timeout=30)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
            line = run.events("agent.turn")[0]
        (turn,) = turns(db)
        woke = item_ids(db)[-1]
        assert turn["agent"] == "scout" and turn["outcome"] == "completed" and turn["wakeItemIds"] == [woke]
        assert len(turn["requestDigest"]) == 64 and turn["usage"] is not None
        rows = agent_rows(db, "scout")
        # CHAT_GRANT has no channels.publish: the reply is kept as a draft with its notice (docs/agents.md#routing).
        assert [r["metadata"]["kind"] for r in rows] == ["source-header-notice", "draft", "drafts"]
        assert rows[-2]["content"][0]["text"] == "you said: scout, say hi"
        assert line["agent"] == "scout" and line["outcome"] == "completed" and "seconds" in line


class TestCatchUpAfterKill:
    async def test_kill_9_between_commit_and_turn_loses_no_wake(self, tmp_path: Path):
        """First run: the item is committed while the agent's debounce is still long; kill -9. The next run wakes for it."""
        db = tmp_path / "host.db"
        steps = [REGISTER, said("m-1", "scout, are you there?", ["chat:addressed"])]
        connector = scripted_connector("disc", {"manifest": CHAT_MANIFEST, "steps": steps}, tmp_path,
                                       grant=CHAT_GRANT, restart={"policy": "never"})
        agent = {"name": "scout", "wake_on": ["addressed"]}
        backend = {"kind": "scripted", "script": ["here"]}
        slow = with_agents(write_config(tmp_path, [connector], name="slow.toml"),
                           ({**agent, "debounce_ms": 600_000, "max_wait_ms": 600_000}, backend))
        async with daemon(slow, tmp_path) as first:
            await wait_for(lambda: item_ids(db), timeout=30, interval=0.005)
            first.signal(signal.SIGKILL)
            assert await first.wait() == -signal.SIGKILL
        (woke,) = item_ids(db)
        assert finished_turns(db) == 0
        pid = next(e["pid"] for e in record(tmp_path, "disc").events if e["kind"] == "start")
        await wait_for(lambda: not alive(pid))

        quick = with_agents(write_config(tmp_path, [connector], name="quick.toml"),
                            ({**agent, "debounce_ms": 10}, backend))
        async with daemon(quick, tmp_path) as second:
            await wait_for(lambda: finished_turns(db) >= 1, timeout=30)
            second.signal(signal.SIGTERM)
            assert await second.wait() == 0
        completed = [t for t in turns(db) if t["outcome"] == "completed"]
        assert [t["wakeItemIds"] for t in completed] == [[woke]]
        assert item_ids(db) == [woke]  # the replayed message was a redelivery, stored once


class TestCatchUpWaitsForItsRoute:
    async def test_a_catch_up_reply_after_kill_9_is_published_once_the_slow_connector_registers(self, tmp_path):
        """docs/agents.md#catch-up: after kill -9 between commit and turn, the connector takes 3 s to register its
        channel again; the catch-up turn waits for it, so its reply is published there, not drafted `unknown`."""
        db = tmp_path / "host.db"
        steps = [REGISTER, said("m-1", "scout, are you there?", ["chat:addressed"])]
        publish = {"channels/publish": {"result": {"delivered": True, "messageId": "sent-1"}}}
        grant = [*CHAT_GRANT, "channels.publish"]
        agent = {"name": "scout", "wake_on": ["addressed"]}
        backend = {"kind": "scripted", "script": ["here"]}
        first_connector = scripted_connector("disc", {"manifest": CHAT_MANIFEST, "steps": steps}, tmp_path,
                                             grant=grant, restart={"policy": "never"})
        slow = with_agents(write_config(tmp_path, [first_connector], name="slow.toml"),
                           ({**agent, "debounce_ms": 600_000, "max_wait_ms": 600_000}, backend))
        async with daemon(slow, tmp_path) as first:
            await wait_for(lambda: item_ids(db), timeout=30, interval=0.005)
            first.signal(signal.SIGKILL)
            assert await first.wait() == -signal.SIGKILL
        assert finished_turns(db) == 0
        pid = next(e["pid"] for e in record(tmp_path, "disc").events if e["kind"] == "start")
        await wait_for(lambda: not alive(pid))

        late = scripted_connector("disc", {"manifest": CHAT_MANIFEST, "steps": [{"sleep": 3}, *steps],
                                           "handlers": publish}, tmp_path, grant=grant, restart={"policy": "never"})
        quick = with_agents(write_config(tmp_path, [late], name="quick.toml"), ({**agent, "debounce_ms": 10}, backend))
        async with daemon(quick, tmp_path) as second:
            await second.wait_event("agent.turn", agent="scout", timeout=30)
            kinds = [row["metadata"]["kind"] for row in agent_rows(db, "scout")]
            assert kinds == ["source-header-notice", "speech"]  # routed and queued, no draft
            await second.wait_event("outbox.delivered", connector="disc", timeout=30)
            (routed,) = second.events("agent.catch_up_routed", agent="scout")
            second.signal(signal.SIGTERM)
            assert await second.wait() == 0
        assert routed["waited_s"] >= 2.5  # the turn waited out the connector's 3 s, from its start
        outbox = [json.loads(line) for line in cli("outbox", "--db", str(db), "--json").stdout.splitlines()]
        assert [(row["channelId"], row["state"]) for row in outbox] == [(ROOM, "delivered")]


def chat(tmp_path: Path, *steps: dict[str, Any]) -> Path:
    """A config with one scripted chat connector sending `steps` after registering the room."""
    return write_config(tmp_path, [scripted_connector("disc", {"manifest": CHAT_MANIFEST, "steps": [REGISTER, *steps]},
                                                      tmp_path, grant=CHAT_GRANT, restart={"policy": "never"})])


class TestOpenAIBackend:
    async def test_a_turn_through_the_openai_backend_against_a_local_server(self, tmp_path: Path):
        """The agent's model is an OpenAI-compatible server in this test: it gets the context, its reply is speech."""
        db = tmp_path / "host.db"
        with LlmServer(default=Reply(text="model heard: {{last_user}}", input_tokens=30, output_tokens=4)) as llm:
            config = with_agents(chat(tmp_path, said("m-1", "scout, what time is it?", ["chat:addressed"])),
                                 ({"name": "scout", "wake_on": ["addressed"], "debounce_ms": 20},
                                  {"kind": "openai", "model": "test-model", "base_url": llm.openai_base_url,
                                   "api_key_env": "TEST_LLM_KEY", "timeout_s": 10}))
            async with daemon(config, tmp_path, env={"TEST_LLM_KEY": "sk-local-test"}) as run:
                await wait_for(lambda: finished_turns(db) >= 1, timeout=30)
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
            requests = llm.requests
        (turn,) = turns(db)
        assert turn["outcome"] == "completed" and turn["model"] and turn["usage"]["inputTokens"] == 30
        assert requests[0].path.endswith("/chat/completions")
        assert requests[0].headers.get("authorization", requests[0].headers.get("Authorization")) == \
            "Bearer sk-local-test"
        body = json.dumps(requests[0].body)
        assert "scout, what time is it?" in body and "[source: disc" in body
        speech = agent_rows(db, "scout")[-2]  # a draft and its notice: CHAT_GRANT has no channels.publish
        assert speech["metadata"]["kind"] == "draft"
        assert speech["content"][0]["text"].startswith("model heard: ")  # the server's answer, stored as it came


class TestIsolation:
    async def test_a_hung_model_delays_only_its_own_agent(self, tmp_path: Path):
        """Agent slow's server never answers; agent quick, woken by the same message, completes its turn at once."""
        db = tmp_path / "host.db"
        with LlmServer(default=Reply(hang=True)) as llm:
            config = with_agents(chat(tmp_path, said("m-1", "@slow @quick, both of you", ["chat:addressed"])),
                                 ({"name": "slow", "wake_on": ["addressed"], "debounce_ms": 0},
                                  {"kind": "openai", "model": "m", "base_url": llm.openai_base_url,
                                   "api_key_env": "TEST_LLM_KEY", "timeout_s": 60, "max_retries": 0}),
                                 ({"name": "quick", "wake_on": ["addressed"], "debounce_ms": 0},
                                  {"kind": "scripted", "script": ["done"]}))
            async with daemon(config, tmp_path, env={"TEST_LLM_KEY": "k"}) as run:
                await wait_for(lambda: finished_turns(db) >= 1, timeout=30)
                await wait_for(lambda: llm.requests, timeout=10)  # slow's call is in flight, and hangs
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
                lines = run.events("agent.turn")
        line = next(e for e in lines if e["agent"] == "quick")
        assert line["outcome"] == "completed" and line["seconds"] < 1.0
        by_agent = {t["agent"]: t["outcome"] for t in turns(db)}
        assert by_agent == {"quick": "completed", "slow": "aborted"}


#: A chat connector that also holds the afterUser hook and the lifecycle.
HOOKED_MANIFEST: dict[str, Any] = {
    **CHAT_MANIFEST,
    "contextHooks": {"beforeInference": {"observe": False, "inject": {"afterUser": True}}},
    "inferenceLifecycle": True,
    "featureSets": {"chat": {"description": "chat", "uses": [
        "channels.register", "channels.incoming", "pushEvents", "inferenceLifecycle",
        "contextHooks.beforeInference.inject.afterUser"]}},
}
HOOKED_GRANT = [*CHAT_GRANT, "inferenceLifecycle", "contextHooks.beforeInference.inject.afterUser"]
INJECTION = {"contextInjections": [{"namespace": "weather", "position": "afterUser",
                                    "content": "[hook] it is raining"}]}


#: The failure reply the failing-backend test sets (docs/agents.md#failure-reply).
SORRY = "Sorry, something went wrong on my side."


def published(folder: Path) -> list[str]:
    """The texts connector disc was asked to publish."""
    return [m["params"]["content"][0]["text"] for m in record(folder, "disc").received
            if m.get("method") == "channels/publish"]


def lifecycle_phases(folder: Path) -> list[tuple[str, str]]:
    return [(e["params"]["inferenceId"], e["params"]["phase"]) for e in record(folder, "disc").events
            if e["kind"] == "notified" and e["method"] == "inference/lifecycle"]


def recorded_injections(db: Path, turn_id: int) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT injections FROM turns WHERE id = ?", (turn_id,)).fetchone()[0] or ""
    finally:
        conn.close()


class TestHooksAndLifecycle:
    async def test_one_turn_with_a_tool_round_hears_two_inferences_each_started_then_completed(self, tmp_path: Path):
        """A turn with one tool round is two backend calls: each has hooks and exactly one started/completed pair."""
        db = tmp_path / "host.db"
        script = {"manifest": HOOKED_MANIFEST, "steps": [REGISTER, said("m-1", "scout?", ["chat:addressed"])],
                  "handlers": {"context/beforeInference": {"result": INJECTION}},
                  "notifications": ["inference/lifecycle"]}
        config = with_agents(
            write_config(tmp_path, [scripted_connector("disc", script, tmp_path, grant=HOOKED_GRANT,
                                                       restart={"policy": "never"})]),
            ({"name": "scout", "wake_on": ["addressed"], "debounce_ms": 0},
             {"kind": "scripted", "script": [json.dumps({"text": "", "tool_calls": [
                 {"name": "history_search", "arguments": {"query": "scout"}}]}), "done"]}))
        async with daemon(config, tmp_path) as run:
            await wait_for(lambda: finished_turns(db) >= 1, timeout=30)
            await wait_for(lambda: len(lifecycle_phases(tmp_path)) >= 4, timeout=10)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        phases = lifecycle_phases(tmp_path)
        inferences = list(dict.fromkeys(i for i, _ in phases))
        assert len(inferences) == 2
        assert all([p for i, p in phases if i == inference] == ["started", "completed"] for inference in inferences)
        asked = [m for m in record(tmp_path, "disc").received if m.get("method") == "context/beforeInference"]
        assert [m["params"]["turnIndex"] for m in asked] == [0, 1]
        assert all(m["params"]["userMessage"] is None for m in asked)  # no observe: never the user's words
        (turn,) = turns(db)
        assert turn["outcome"] == "completed"
        assert "[hook] it is raining" in recorded_injections(db, turn["id"])  # kept, so the digest can be remade

    async def test_a_failing_backend_still_ends_its_inference_once_with_failed(self, tmp_path: Path):
        """The model's server answers 500 every time: the connector hears started then failed, once; and
        (docs/agents.md#failure-reply) it receives the failure reply, and `turns --json` has the reason."""
        db = tmp_path / "host.db"
        script = {"manifest": HOOKED_MANIFEST, "steps": [REGISTER, said("m-1", "scout?", ["chat:addressed"])],
                  "handlers": {"context/beforeInference": {"result": {"contextInjections": []}},
                               "channels/publish": {"result": {"delivered": True, "messageId": "sent-1"}}},
                  "notifications": ["inference/lifecycle"]}
        with LlmServer(default=Reply.error(500)) as llm:
            config = with_agents(
                write_config(tmp_path, [scripted_connector("disc", script, tmp_path,
                                                           grant=[*HOOKED_GRANT, "channels.publish"],
                                                           restart={"policy": "never"})]),
                ({"name": "scout", "wake_on": ["addressed"], "debounce_ms": 0, "failure_reply": SORRY},
                 {"kind": "openai", "model": "m", "base_url": llm.openai_base_url, "api_key_env": "TEST_LLM_KEY",
                  "max_retries": 0, "timeout_s": 10}))
            async with daemon(config, tmp_path, env={"TEST_LLM_KEY": "k"}) as run:
                await wait_for(lambda: finished_turns(db) >= 1, timeout=30)
                await wait_for(lambda: len(lifecycle_phases(tmp_path)) >= 2 and published(tmp_path), timeout=30)
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
        assert [p for _, p in lifecycle_phases(tmp_path)] == ["started", "failed"]
        assert published(tmp_path) == [SORRY]
        (turn,) = turns(db)
        assert (turn["outcome"], turn["reason"]) == ("failed", "backend_error")
        kinds = [row["metadata"]["kind"] for row in agent_rows(db, "scout")]
        assert "turn-failed" in kinds and kinds.count("speech") == 1, kinds

    async def test_a_shutdown_mid_inference_ends_it_with_aborted(self, tmp_path: Path):
        """SIGTERM while the model hangs: the connector hears started then aborted, and the turn is aborted."""
        db = tmp_path / "host.db"
        script = {"manifest": HOOKED_MANIFEST, "steps": [REGISTER, said("m-1", "scout?", ["chat:addressed"])],
                  "handlers": {"context/beforeInference": {"result": {"contextInjections": []}}},
                  "notifications": ["inference/lifecycle"]}
        with LlmServer(default=Reply(hang=True)) as llm:
            config = with_agents(
                write_config(tmp_path, [scripted_connector("disc", script, tmp_path, grant=HOOKED_GRANT,
                                                           restart={"policy": "never"})]),
                ({"name": "scout", "wake_on": ["addressed"], "debounce_ms": 0},
                 {"kind": "openai", "model": "m", "base_url": llm.openai_base_url, "api_key_env": "TEST_LLM_KEY",
                  "max_retries": 0, "timeout_s": 60}))
            async with daemon(config, tmp_path, env={"TEST_LLM_KEY": "k"}) as run:
                await wait_for(lambda: llm.requests and lifecycle_phases(tmp_path), timeout=30)
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
        assert [p for _, p in lifecycle_phases(tmp_path)] == ["started", "aborted"]
        (turn,) = turns(db)
        assert turn["outcome"] == "aborted"
