"""Robustness on the wire: whatever one connector does, the daemon and the other connectors go on.

docs/connectors.md §1 and docs/mcpl-checklist.md item 42: bad stdout lines, oversized lines,
stderr floods and responses with unknown ids neither crash the daemon nor
stall another connection; a connector that dies in the middle of a
host-initiated exchange (the initial policy, a manifest fetch, a
channels/open) ends only its own life.

-32700: the host never answers a line it cannot parse (it logs the line and
goes on, docs/mcpl-compat.md: some deployed connectors crash on any reply they
did not expect); the test below asserts that no reply goes out.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from structlog.testing import capture_logs

from mcplhost.protocol.connection import Mode

from ..builders import incoming, message, register, texts
from ..harness import (
    CHAT_GRANT,
    CHAT_MANIFEST,
    HINT,
    config_with,
    connected,
    error_of,
    items_when,
    logged,
    record,
    result_of,
    running_host,
    scripted,
    wait_for,
)


def neighbour(tmp_path, *, wait_for_method: str | None = None):
    """A well-behaved connector that registers a channel and delivers one message."""
    steps = [register("ok:g1:room")]
    if wait_for_method is not None:
        steps.insert(0, {"wait": wait_for_method})
    steps.append(incoming(message("ok:g1:room", "m-ok", "still here")))
    return scripted("ok", {"manifest": CHAT_MANIFEST, "steps": steps}, tmp_path, grant=CHAT_GRANT)


class TestBadInput:
    async def test_junk_oversized_lines_floods_and_unknown_ids_harm_no_one(self, tmp_path) -> None:
        """One connector writes every kind of bad line; it keeps being served and its neighbour is unaffected."""
        junk = [
            {"raw": "heartbeat-mcpl starting..."},
            {"raw": "{not json"},
            {"raw": "[1, 2, 3]"},
            {"raw": '{"jsonrpc":"2.0","id":4242,"result":{}}'},
            {"raw": '{"jsonrpc":"2.0","id":"nobody","error":{"code":-32603,"message":"x"}}'},
            {"raw": '{"jsonrpc":"2.0","result":{}}'},
            {"raw": "x" * 5000},
            {"raw": '{"jsonrpc":"2.0","id":"s-1","method":"ping"}'},
            {"raw": '{"jsonrpc":"2.0","id":null,"method":"ping"}'},
            {"raw": '{"jsonrpc":"1.0","id":77,"method":"ping"}'},
            {"stderr": "E" * 300, "repeat": 3000},
            register("bad:g1:room"),
            incoming(message("bad:g1:room", "m-bad", "served")),
        ]
        bad = scripted("bad", {"manifest": CHAT_MANIFEST, "steps": junk}, tmp_path, grant=CHAT_GRANT,
                       max_line_bytes=1024)
        with capture_logs() as logs:
            async with running_host(config_with(tmp_path, bad, neighbour(tmp_path))):
                await wait_for(lambda: record(tmp_path, "bad").done and record(tmp_path, "ok").done)
                items = await items_when(tmp_path, 2)
        assert sorted(texts(i.content)[-1] for i in items) == ["served", "still here"]
        replies = [m for m in record(tmp_path, "bad").received if "id" in m and "method" not in m]
        by_id = {}
        for reply in replies:
            by_id.setdefault(json.dumps(reply["id"]), []).append(reply)
        assert by_id['"s-1"'] == [{"jsonrpc": "2.0", "id": "s-1", "result": {}}]  # a string id stays a string
        assert [r["error"]["code"] for r in by_id["null"]] == [-32600]  # the null-id request, nothing for junk
        assert [r["error"]["code"] for r in by_id["77"]] == [-32600]
        assert not [r for r in replies if r.get("error", {}).get("code") == -32700]
        assert logged(logs, "rpc.line_too_long", connector="bad")
        assert logged(logs, "rpc.junk_line", connector="bad")
        assert logged(logs, "rpc.response_dropped", connector="bad")
        assert logged(logs, "connector.stderr_dropped", connector="bad")


class TestDeathMidExchange:
    async def test_dying_while_the_initial_policy_is_outstanding_ends_only_that_connector(self, tmp_path) -> None:
        """A connector that exits before answering featureSets/update fails its own handshake; the host goes on."""
        dying = scripted("dying", {"manifest": CHAT_MANIFEST, "policy": "ignore",
                                   "after": "initialized", "steps": [{"wait": "featureSets/update"}, {"exit": 1}]},
                         tmp_path, grant=CHAT_GRANT)
        with capture_logs() as logs:
            async with running_host(config_with(tmp_path, dying, neighbour(tmp_path))):
                await wait_for(lambda: logged(logs, "connector.stopped", connector="dying"))
                await items_when(tmp_path, 1)
        assert logged(logs, "connector.exited", connector="dying", ended="handshake_failed")

    async def test_dying_while_a_manifest_fetch_is_outstanding_ends_only_that_connector(self, tmp_path) -> None:
        """A connector that hints, then exits instead of answering mcpl/manifest, ends its own life only."""
        dying = scripted("dying", {"manifest": CHAT_MANIFEST, "handlers": {"mcpl/manifest": "ignore"},
                                   "steps": [HINT, {"wait": "mcpl/manifest"}, {"exit": 1}]},
                         tmp_path, grant=CHAT_GRANT)
        with capture_logs() as logs:
            async with running_host(config_with(tmp_path, dying, neighbour(tmp_path))):
                await wait_for(lambda: logged(logs, "connector.stopped", connector="dying"))
                await items_when(tmp_path, 1)
        assert logged(logs, "connector.exited", connector="dying", ended="exited")

    async def test_dying_while_channels_open_is_outstanding_ends_only_that_connector(self, tmp_path) -> None:
        """A connector that exits instead of answering channels/open ends its own life only."""
        dying = scripted("dying", {"manifest": CHAT_MANIFEST, "handlers": {"channels/open": "ignore"},
                                   "steps": [{"request": "channels/register", "params": {"channels": [
                                       {"id": "d:1", "type": "d", "label": "#1", "direction": "bidirectional",
                                        "address": {}, "initiallyOpen": True}]}},
                                       {"wait": "channels/open"}, {"exit": 1}]},
                         tmp_path, grant=CHAT_GRANT)
        with capture_logs() as logs:
            async with running_host(config_with(tmp_path, dying, neighbour(tmp_path))):
                await wait_for(lambda: logged(logs, "connector.stopped", connector="dying"))
                await items_when(tmp_path, 1)
        assert logged(logs, "connector.exited", connector="dying", ended="exited")

    async def test_refusing_a_later_policy_with_fallback_close_does_not_crash_the_host(self, tmp_path) -> None:
        """A connector that refuses the policy a manifest change prompts loses MCPL; the daemon goes on."""
        async with self.refusing_host(tmp_path) as logs:
            await wait_for(lambda: logged(logs, "connector.policy_closed", connector="refuser"))
        rec = record(tmp_path, "refuser")
        assert result_of(rec, 0)["results"][0]["accepted"] is True
        # Its message sent after the refusal is never stored (refused, or the connector is gone first).
        assert not any(e.get("step") == 4 and "result" in e for e in rec.events if e["kind"] == "answer")
        assert [texts(i.content)[-1] for i in await items_when(tmp_path, 1)] == ["still here"]

    async def test_refusing_a_later_policy_with_fallback_close_stops_the_connector(self, tmp_path) -> None:
        """After a later refusal with fallback "close" the host stops the connector process."""
        async with self.refusing_host(tmp_path) as logs:
            await wait_for(lambda: logged(logs, "connector.policy_closed", connector="refuser"))
            await wait_for(lambda: logged(logs, "connector.exited", connector="refuser"), timeout=2.0)

    @staticmethod
    @asynccontextmanager
    async def refusing_host(tmp_path) -> AsyncIterator[list[dict[str, Any]]]:
        refusal = {"result": {"accepted": False, "fallback": "close"}}
        fetched = {k: v for k, v in CHAT_MANIFEST.items() if k != "pushEvents"}
        script = {"manifest": CHAT_MANIFEST, "policy": [{"result": {"accepted": True}}, refusal],
                  "handlers": {"mcpl/manifest": {"result": fetched}},
                  "steps": [register("r:g1:room"), HINT, {"wait": "featureSets/update", "count": 2},
                            {"request": "ping"}, incoming(message("r:g1:room", "m-r"))]}
        spec = scripted("refuser", script, tmp_path, grant=CHAT_GRANT)
        with capture_logs() as logs:
            async with running_host(config_with(tmp_path, spec, neighbour(tmp_path))):
                await items_when(tmp_path, 1)
                yield logs


class TestHintsOutsideMcpl:
    async def test_a_hint_from_a_plain_mcp_server_is_ignored(self, tmp_path) -> None:
        """A server without a manifest that sends mcpl/manifestChanged gets no fetch, and the host goes on."""
        plain = scripted("plain", {"manifest": None, "tools": True, "after": "initialized",
                                   "steps": [HINT, {"request": "ping"}, {"request": "push/event", "params": {}}]},
                         tmp_path, grant=CHAT_GRANT)
        async with running_host(config_with(tmp_path, plain, neighbour(tmp_path))):
            await wait_for(lambda: record(tmp_path, "plain").done)
            await items_when(tmp_path, 1)
        rec = record(tmp_path, "plain")
        assert "mcpl/manifest" not in rec.methods_received()
        assert error_of(rec, 2)["data"] == {"capability": "pushEvents", "reason": "mcp_only"}

    async def test_a_hint_after_a_refusal_never_brings_mcpl_back(self, tmp_path) -> None:
        """After falling back to MCP-only, a hint neither fetches nor sends a policy that could make it ready."""
        refusal = {"result": {"accepted": False, "fallback": "mcp-only"}}
        fetched = {**CHAT_MANIFEST, "featureSets": {}}
        script = {"manifest": CHAT_MANIFEST, "policy": [refusal, {"result": {"accepted": True}}],
                  "handlers": {"mcpl/manifest": {"result": fetched}},
                  "steps": [HINT, {"request": "ping"}, register("x:1")]}
        spec = scripted("fallen", script, tmp_path, grant=CHAT_GRANT)
        async with running_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "fallen").done)
        rec = record(tmp_path, "fallen")
        assert rec.methods_received().count("featureSets/update") == 1
        assert "mcpl/manifest" not in rec.methods_received()
        assert error_of(rec, 2)["data"] == {"capability": "channels.register", "reason": "mcp_only"}

    async def test_a_refresh_on_a_fallen_connection_does_nothing(self, tmp_path) -> None:
        """refresh_manifest on an MCP-only connection neither fetches nor sends a policy that could revive it."""
        refusal = {"result": {"accepted": False, "fallback": "mcp-only"}}
        script = {"manifest": CHAT_MANIFEST, "policy": [refusal, {"result": {"accepted": True}}],
                  "handlers": {"mcpl/manifest": {"result": {**CHAT_MANIFEST, "featureSets": {}}}}}
        spec = scripted("fallen", script, tmp_path, grant=CHAT_GRANT)
        async with connected(spec, tmp_path) as connection:
            assert connection.mode is Mode.MCP_ONLY
            await connection.refresh_manifest()
            assert connection.mode is Mode.MCP_ONLY
        methods = record(tmp_path, "fallen").methods_received()
        assert "mcpl/manifest" not in methods and methods.count("featureSets/update") == 1
