"""A model server that answers badly, through `mcplhost run` (docs/agents.md#bounds): a stream request answered with
plain JSON, 3,000 tool calls, a 150 MB answer. A real connector, real `openai` SDK calls, the local model server
(tests/agents/llm_server.py), the daemon's own memory read from /proc.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from mcplhost.agents.backends.answer_bounds import not_run_text
from mcplhost.config import DEFAULT_MAX_TOOL_CALLS_PER_ROUND

from ..agents.llm_server import LlmServer, Reply, ToolUse
from ..cli.support import daemon, scripted_connector, write_config
from ..harness import record, wait_for
from .test_agents import agent_rows, finished_turns, turns, with_agents

ROOM = "disc:g1:room"
KEY_ENV = "TEST_LLM_KEY"
MANIFEST: dict[str, Any] = {
    "version": "0.5",
    "channels": {"register": True, "incoming": True, "publish": True, "streaming": True},
    "featureSets": {"chat": {"description": "chat", "uses": [
        "channels.register", "channels.incoming", "channels.publish", "channels.streaming"]}},
}
GRANT = ["channels.register", "channels.incoming", "channels.publish", "channels.streaming"]
REGISTER = {"request": "channels/register", "params": {"channels": [
    {"id": ROOM, "type": "disc", "direction": "bidirectional", "address": {}, "label": "#room"}]}}
MENTION = {"request": "channels/incoming", "params": {"messages": [
    {"channelId": ROOM, "messageId": "m-1", "author": {"id": "u-ann", "name": "Ann"},
     "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": "bot, answer me"}],
     "tags": ["chat:addressed"]}]}}
#: What the daemon's peak resident memory may grow by over the hostile turns (it reached 983 MB unbounded).
RSS_GROWTH_MAX_KB = 96 * 1024


def config(folder: Path, *agents: tuple[str, LlmServer], streaming: bool = True) -> Path:
    """One chat connector sending one message, granted `channels.streaming` (so turns stream) or not."""
    script = {"manifest": MANIFEST, "steps": [REGISTER, MENTION],
              "handlers": {"channels/publish": {"result": {"delivered": True, "messageId": "out-1"}}}}
    grant = GRANT if streaming else [g for g in GRANT if g != "channels.streaming"]
    path = write_config(folder, [scripted_connector("disc", script, folder, grant=grant,
                                                    restart={"policy": "never"})])
    return with_agents(path, *(({"name": name, "wake_on": ["all"], "debounce_ms": 0},
                                {"kind": "openai", "model": "m", "base_url": server.openai_base_url,
                                 "api_key_env": KEY_ENV, "max_retries": 0, "timeout_s": 20})
                               for name, server in agents))


def published(folder: Path) -> list[str]:
    return [m["params"]["content"][0]["text"] for m in record(folder, "disc").received
            if m.get("method") == "channels/publish"]


def spam_published(folder: Path) -> list[str]:
    return [text for text in published(folder) if text.startswith("spam ")]


def memory_kb(pid: int, field: str) -> int:
    """VmRSS or VmHWM (the peak) of a process, in kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


async def test_a_stream_request_answered_with_plain_json_is_read_again_and_published(tmp_path: Path) -> None:
    """The vanished reply: the connector holds channels.streaming, the server ignores `stream: true`. The
    empty stream is read again without streaming, the reply is published, and the log says why once."""
    db = tmp_path / "host.db"
    with LlmServer(default=Reply(text="the reply that vanished", stream_as_json=True)) as llm:
        async with daemon(config(tmp_path, ("scout", llm)), tmp_path, env={KEY_ENV: "k"}) as run:
            await wait_for(lambda: published(tmp_path), timeout=30)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
            (warning,) = run.events("backend.empty_stream_read_again")
        requests = llm.requests
    assert published(tmp_path) == ["the reply that vanished"]
    (turn,) = turns(db)
    assert turn["outcome"] == "completed" and turn["usage"]["outputTokens"] > 0
    assert [r.body.get("stream") for r in requests] == [True, None]
    assert warning["level"] == "warning" and warning["backend"] == "openai"


async def test_3000_tool_calls_and_a_150_mb_answer_leave_memory_disk_and_lines_bounded(tmp_path: Path) -> None:
    """Two agents wake on one message. One model asks for 3,000 channel_publish calls: 16 run, every other call
    gets its not-run result, the turn completes. The other answers 150 MB: the read stops at the body bound, the
    turn fails `too_large` with its notice. The daemon's peak memory grows by far less than the answer, the
    database stays small, and no line the connector got is large."""
    db = tmp_path / "host.db"
    spam = tuple(ToolUse(f"call_{n}", "channel_publish", {"channel": "#room", "text": f"spam {n}"})
                 for n in range(3000))
    # Undeclared: no content-length to refuse it by, the body is counted as it arrives.
    hostile = Reply(huge=150 * 2**20, declared=False)
    with LlmServer(default=Reply(text="done")) as flood, LlmServer(default=hostile) as huge:
        flood.push(Reply(text="", tool_calls=spam))
        # Not streamed: the SDK builds a model object per event (about 50 µs each, more on a loaded machine), so
        # 3,000 streamed calls take seconds; the streamed bounds are tests/agents/backends/test_bounds.py's.
        async with daemon(config(tmp_path, ("spammer", flood), ("talker", huge), streaming=False), tmp_path,
                          env={KEY_ENV: "k"}) as run:
            await run.wait_event("host.ready", timeout=30)
            ready_kb = memory_kb(run.pid, "VmRSS")
            await wait_for(lambda: finished_turns(db) >= 2, timeout=60)
            await wait_for(lambda: len(spam_published(tmp_path)) >= DEFAULT_MAX_TOOL_CALLS_PER_ROUND, timeout=30)
            peak_kb = memory_kb(run.pid, "VmHWM")
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
            not_run_lines = run.events("agent.tool_calls_not_run")
    by_agent = {t["agent"]: t for t in turns(db)}
    assert by_agent["spammer"]["outcome"] == "completed"
    assert (by_agent["talker"]["outcome"], by_agent["talker"]["reason"]) == ("failed", "backend_error")
    assert spam_published(tmp_path) == [f"spam {n}" for n in range(DEFAULT_MAX_TOOL_CALLS_PER_ROUND)]
    assert [(e["calls"], e["limit"]) for e in not_run_lines] == [(3000, DEFAULT_MAX_TOOL_CALLS_PER_ROUND)]

    spammer = agent_rows(db, "spammer")
    results = [r for r in spammer if r["metadata"]["kind"] == "tool-result"]
    assert len(results) == 3000
    limit = DEFAULT_MAX_TOOL_CALLS_PER_ROUND
    assert sum(r["content"][0]["text"] == not_run_text(3000, limit) for r in results) == 3000 - limit
    (notice,) = [r for r in agent_rows(db, "talker") if r["metadata"]["kind"] == "turn-failed"]
    assert notice["metadata"]["reason"] == "too_large"

    assert peak_kb - ready_kb < RSS_GROWTH_MAX_KB, (ready_kb, peak_kb)
    stored = sum(p.stat().st_size for p in tmp_path.glob("host.db*"))
    assert stored < 32 * 2**20
    assert max(len(json.dumps(m)) for m in record(tmp_path, "disc").received) < 64 * 1024
