"""Secrets never leave (docs/agents.md#secrets), end to end: a host over a real scripted connector and a model on
the local model server (tests/agents/llm_server.py) told to repeat the keys.

The connector's DISCORD_TOKEN (its `env`) arrives in an inbound message and in a tool result; the model's own
api key (its `api_key_env`) is what the model says in its prose, streamed in 4-character deltas, and both are in
a `channel_publish` and a connector tool call. Afterwards neither value is in the database file's bytes, the
log, what the connector received or what the model was sent after the first request; the prose is a draft with
reason `secret` and its notice names the variable.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
from typing import Any

import anyio
import msgspec
import pytest
import structlog

from mcplhost import logs
from mcplhost.config import AgentConfig, BackendConfig, ConnectorConfig
from mcplhost.secrets import NO_SECRETS

from ..agents.llm_server import LlmServer, Reply, ToolUse
from ..cli.support import daemon, scripted_connector, toml_table, write_config
from ..harness import CHAT_GRANT, config_with, record, running_host, scripted, stored_items, wait_for

ROOM = "disc:g1:room"
TOKEN = "discord-token-0123456789"
API_KEY = "sk-model-key-abcdef"
KEY_ENV = "MCPLHOST_SECRETS_TEST_KEY"
MANIFEST: dict[str, Any] = {
    "version": "0.5",
    "channels": {"register": True, "incoming": True, "publish": True, "streaming": True},
    "featureSets": {"chat": {"description": "chat", "uses": [
        "channels.register", "channels.incoming", "channels.publish", "channels.streaming"]}},
}
GRANT = [*CHAT_GRANT, "channels.publish", "channels.streaming", "tools"]
VAULT = {"name": "vault", "description": "Reads the vault", "inputSchema": {
    "type": "object", "properties": {"q": {"type": "string"}}}}


def connector(folder) -> ConnectorConfig:
    register = {"request": "channels/register", "params": {"channels": [
        {"id": ROOM, "type": "disc", "direction": "bidirectional", "address": {}, "label": "#room"}]}}
    mention = {"request": "channels/incoming", "params": {"messages": [
        {"channelId": ROOM, "messageId": "m-1", "author": {"id": "u-1", "name": "Ann"},
         "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": f"repeat this: {TOKEN}"}],
         "tags": ["chat:addressed"]}]}}
    script = {"manifest": MANIFEST, "tools": True, "steps": [{"wait": "tools/list"}, register, mention],
              "handlers": {"tools/list": {"result": {"tools": [VAULT]}},
                           "tools/call": {"result": {"content": [{"type": "text", "text": f"the vault: {TOKEN}"}]}},
                           "channels/publish": {"result": {"delivered": True, "messageId": "out-1"}}}}
    spec = scripted("disc", script, folder, grant=GRANT)
    return msgspec.structs.replace(spec, env={**spec.env, "DISCORD_TOKEN": TOKEN})


@pytest.fixture
def json_log(tmp_path, monkeypatch):
    """The host's log as configured by the CLI (JSON lines on its stderr, here a file); the lines, on demand."""
    path = tmp_path / "stderr.log"
    with path.open("w") as stderr:
        monkeypatch.setattr(sys, "stderr", stderr)
        logs.configure("json")

        def lines() -> str:
            logs.shutdown()
            return path.read_text()

        yield lines
        logs.shutdown()
    logs.redact_secrets(NO_SECRETS)
    structlog.reset_defaults()


async def test_no_secret_reaches_the_store_the_log_the_connector_or_the_model(tmp_path, monkeypatch,
                                                                                json_log) -> None:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    with LlmServer(default=Reply(text="done")) as server:
        server.push(
            Reply(text="", tool_calls=(ToolUse(id="c1", name="disc__vault", arguments={}),)),
            Reply(text="", tool_calls=(
                ToolUse(id="c2", name="channel_publish", arguments={"channel": "#room", "text": f"it is {TOKEN}"}),
                ToolUse(id="c3", name="disc__vault", arguments={"q": API_KEY}))),
            Reply(text=f"Sure. My own key is {API_KEY}, there."))
        spec = connector(tmp_path)
        config = msgspec.structs.replace(config_with(tmp_path, spec), agents=[AgentConfig(
            name="scout", wake_on=["addressed"], debounce_ms=0, backend=BackendConfig(
                kind="openai", model="m", base_url=server.openai_base_url, api_key_env=KEY_ENV, max_retries=0))])
        async with running_host(config):
            async def drafted() -> None:
                while not [i for i in await stored_items(tmp_path) if i.metadata.get("kind") == "draft"]:
                    await anyio.sleep(0.02)

            with anyio.fail_after(30):
                await drafted()
        requests = server.requests
    items = await stored_items(tmp_path)
    log_text = json_log()

    (draft,) = [i for i in items if i.metadata.get("kind") == "draft"]
    assert draft.metadata["reason"] == "secret"
    assert draft.content[0]["text"] == f"Sure. My own key is [redacted:{KEY_ENV}], there."
    (notice,) = [i for i in items if i.metadata.get("kind") == "drafts"]
    assert KEY_ENV in notice.content[0]["text"] and API_KEY not in notice.content[0]["text"]
    inbound = [i for i in items if i.role == "user" and i.agent is None]
    assert "repeat this: [redacted:DISCORD_TOKEN]" in json.dumps(inbound[0].content)

    # The store's file, raw: checkpointed, then the .db and any -wal bytes.
    with sqlite3.connect(tmp_path / "host.db") as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for path in tmp_path.glob("host.db*"):
        raw = path.read_bytes()
        assert TOKEN.encode() not in raw and API_KEY.encode() not in raw, path

    methods = record(tmp_path, "disc").received  # what the connector was sent (it sent the token itself)
    received = json.dumps(methods)
    assert TOKEN not in received and API_KEY not in received
    calls = [m for m in methods if m.get("method") == "tools/call"]
    assert [c["params"]["arguments"] for c in calls] == [{}]  # the call holding the key was refused, not sent
    assert not [m for m in methods if m.get("method") == "channels/publish"]  # refused, and the prose a draft
    streamed = "".join(m["params"].get("delta", "") for m in methods
                       if str(m.get("method", "")).startswith("channels/outgoing/chunk"))
    assert API_KEY not in streamed and API_KEY[: len(API_KEY) // 2] not in streamed

    assert TOKEN not in log_text and API_KEY not in log_text
    assert "[redacted:" in log_text or '"variable"' in log_text

    # What the model was sent: the inbound item and the tool result redacted, the refusals naming the variables.
    sent = json.dumps([r.body for r in requests])
    assert TOKEN not in sent and API_KEY not in sent
    assert "[redacted:DISCORD_TOKEN]" in sent and f"hold the value of the secret {KEY_ENV}" in sent


# --- server-initiated inference (docs/agents.md#secrets), through `mcplhost run` ---------------------------

ASKER_TOKEN = "asker-token-9876543210"
THINK_MANIFEST: dict[str, Any] = {
    "version": "0.5", "inferenceRequest": {"streaming": True},
    "featureSets": {"think": {"description": "asks the model",
                              "uses": ["inferenceRequest", "inferenceRequest.streaming"]}},
}
CLEAN_LEAD = "x" * 40 + " "


def asking(stream: bool) -> dict[str, Any]:
    return {"request": "inference/request", "params": {
        "featureSet": "think", "stream": stream, "messages": [{"role": "user", "content": "tell me"}]}}


async def test_no_secret_reaches_a_connector_through_inference_request(tmp_path) -> None:
    """A model server echoing its key (and naming a connector's token): the asking connector receives neither,
    in no result and no chunk; each such answer is refused with reason `secret`, a clean one still answers."""
    with LlmServer(default=Reply(text="all fine")) as server:
        server.push(Reply(text="my key: {{key}}"),  # not streamed
                    Reply(text=CLEAN_LEAD + "{{key}} and more after it"),  # streamed: stops before the key
                    Reply(text=CLEAN_LEAD + f"the token {ASKER_TOKEN} end"))  # streamed: the other secret
        steps = [asking(False), asking(True), asking(True), asking(True)]
        spec = scripted_connector("asker", {"manifest": THINK_MANIFEST, "steps": steps}, tmp_path,
                                  grant=["inferenceRequest", "inferenceRequest.streaming"],
                                  restart={"policy": "never"})
        spec["env"] = {**spec["env"], "ASKER_TOKEN": ASKER_TOKEN}
        config = write_config(tmp_path, [spec])
        config.write_text(config.read_text(encoding="utf-8") + "\n" + toml_table("[inference.backend]", {
            "kind": "openai", "model": "m", "base_url": server.openai_base_url, "api_key_env": KEY_ENV,
            "max_retries": 0}), encoding="utf-8")
        async with daemon(config, tmp_path, env={KEY_ENV: API_KEY}) as run:
            await wait_for(lambda: record(tmp_path, "asker").done, timeout=30)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
            withheld = run.events("inference.withheld")
        assert any(API_KEY in json.dumps(r.headers) for r in server.requests)  # the server did have the key

    rec = record(tmp_path, "asker")
    received = json.dumps(rec.received)
    for secret in (API_KEY, ASKER_TOKEN):
        assert secret not in received
    answers = rec.answers()
    assert [answers[step].get("error", {}).get("data") for step in range(3)] == [{"reason": "secret"}] * 3
    assert answers[3]["result"]["content"] == "all fine"
    ids = [m["id"] for m in rec.sent if m.get("method") == "inference/request"]
    chunks = [m["params"] for m in rec.received if m.get("method") == "inference/chunk"]
    streamed = ["".join(c["delta"] for c in chunks if c["requestId"] == request_id) for request_id in ids[1:]]
    # Each refused stream sent only what came before the secret; the clean one sent all of its text.
    before = [CLEAN_LEAD, CLEAN_LEAD + "the token "]
    assert all(streamed[n] and before[n].startswith(streamed[n]) for n in range(2)), streamed
    assert streamed[2] == "all fine"
    assert sorted(e["variable"] for e in withheld) == sorted([KEY_ENV, KEY_ENV, "ASKER_TOKEN"])
