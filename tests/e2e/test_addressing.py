"""Several agents on one connector, through `mcplhost run` (docs/agents.md#addressing).

ada and bob both hear two connectors and wake on `addressed`. On `shared`
(no `agent` key) an addressed item wakes only the agents its body names;
on `ada_bot` (`agent = "ada"`) every addressed item is ada's, whatever it
names, and bob hears it as ambient. `explain` says `not_addressed`.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

from ..cli.support import cli, daemon, scripted_connector, write_config
from ..harness import CHAT_GRANT, CHAT_MANIFEST, wait_for
from .test_agents import turns, with_agents


def by_message_id(db: Path) -> dict[str, int]:
    """Item id by platform message id, read beside the running host."""
    if not db.exists():
        return {}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT json_extract(metadata, '$.messageId'), id FROM items WHERE agent IS NULL"))
    except sqlite3.OperationalError:
        return {}
    finally:
        conn.close()


def woken(db: Path) -> dict[str, list[int]]:
    """Per agent, the items its finished turns woke for."""
    found: dict[str, list[int]] = {"ada": [], "bob": []}
    for turn in turns(db):
        if turn["outcome"] is not None:
            found[turn["agent"]] += turn["wakeItemIds"]
    return {agent: sorted(ids) for agent, ids in found.items()}


def room_steps(room: str, *messages: tuple[str, str]) -> list[dict[str, Any]]:
    register = {"request": "channels/register", "params": {"channels": [
        {"id": room, "type": "disc", "direction": "bidirectional", "address": {}, "label": "#room"}]}}
    return [register, *({"request": "channels/incoming", "params": {"messages": [
        {"channelId": room, "messageId": message_id, "author": {"id": "u-alice", "name": "Alice"},
         "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": body}],
         "tags": ["chat:mention"]}]}} for message_id, body in messages)]


class TestSeveralAgentsOnOneConnector:
    async def test_a_mention_wakes_the_agent_it_names_or_the_connector_s_agent(self, tmp_path: Path):
        db = tmp_path / "host.db"
        shared = scripted_connector("shared", {"manifest": CHAT_MANIFEST, "steps": room_steps(
            "shared:room", ("m-1", "@ada only you, please"), ("m-2", "Bob, your turn"),
            ("m-3", "hello bot"))}, tmp_path, grant=CHAT_GRANT, restart={"policy": "never"})
        bound = scripted_connector("ada_bot", {"manifest": CHAT_MANIFEST, "steps": room_steps(
            "ada_bot:room", ("m-4", "@bob only you"))}, tmp_path, grant=CHAT_GRANT, restart={"policy": "never"},
            agent="ada")
        config = with_agents(write_config(tmp_path, [shared, bound]),
                             *(({"name": name, "wake_on": ["addressed"], "debounce_ms": 200},
                                {"kind": "scripted", "script": ["here"]}) for name in ("ada", "bob")))
        check = cli("check-config", str(config))
        assert check.returncode == 0
        assert "warning: connectors[0].agent: not set, and ada, bob all wake on addressed items of 'shared'" in (
            check.stderr) and "connectors[1]" not in check.stderr
        async with daemon(config, tmp_path) as run:
            ids = await wait_for(lambda: (found := by_message_id(db)) and len(found) == 4 and found, timeout=30)
            expected = {"ada": sorted([ids["m-1"], ids["m-4"]]), "bob": [ids["m-2"]]}
            await wait_for(lambda: woken(db) == expected, timeout=30)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        assert woken(db) == expected  # m-3 named no one: no turn; m-4 was ada's, though it named bob

        def reasons(item: str) -> dict[str, Any]:
            out = cli("explain", "--db", str(db), "--config", str(config), "--json", str(ids[item])).stdout
            return {a["agent"]: (a["decision"], a["reason"]) for a in map(json.loads, out.splitlines())}

        assert reasons("m-1")["bob"] == ("not_waking", "not_addressed")
        assert reasons("m-3") == {"ada": ("not_waking", "not_addressed"), "bob": ("not_waking", "not_addressed")}
        assert reasons("m-4") == {"ada": ("woke", None), "bob": ("not_waking", "not_addressed")}
