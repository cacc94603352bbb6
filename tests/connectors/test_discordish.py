"""The discord-mcpl look-alike under the real host: every message it sends is stored with its header.

mcplhost.connectors.discordish honours `disabled` the way discord-mcpl does:
a `discord.messaging` named there sends nothing. Its `uses` lists
channels.typing, .streaming and .acknowledge, which the grant below leaves
out, so a host that put the set in `disabled` for that (the old rule) would
store nothing at all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from mcplhost.config import ConnectorConfig, FeatureSetSelection, RestartConfig

from ..builders import texts
from ..harness import PYTHON, REPO, config_with, items_when, logged, running_host, stored_items, wait_for

#: The grant of the issue's outside check: no typing, streaming or acknowledge.
GRANT = ["channels.register", "channels.incoming", "channels.publish", "channels.lifecycle", "pushEvents", "tools"]
MESSAGES = 6


def discordish(folder: Path, name: str = "discord", grant: list[str] = GRANT, **fields: Any) -> ConnectorConfig:
    env = {"PYTHONPATH": str(REPO), "DISCORD_MESSAGES": str(MESSAGES), "DISCORD_INTERVAL_S": "0.02",
           "DISCORD_RECORD": str(folder / f"{name}.jsonl")}
    return ConnectorConfig(name=name, command=[PYTHON, "-m", "mcplhost.connectors.discordish"], env=env,
                           cwd=str(REPO), grant=grant, restart=RestartConfig(policy="never"), request_timeout_s=5.0,
                           **fields)


def events(folder: Path, name: str = "discord") -> list[dict[str, Any]]:
    path = folder / f"{name}.jsonl"
    if not path.exists():
        return []
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            pass  # a line still being written
    return found


def done(folder: Path, name: str = "discord") -> bool:
    return any(e["kind"] == "done" for e in events(folder, name))


class TestDiscordish:
    async def test_every_message_sent_under_a_grant_without_typing_is_stored_with_its_header(self, tmp_path) -> None:
        """Nothing is disabled on the wire, nothing dropped, and each sent message is one stored item with a header."""
        with capture_logs() as logs:
            async with running_host(config_with(tmp_path, discordish(tmp_path))):
                await wait_for(lambda: done(tmp_path))
                items = await items_when(tmp_path, MESSAGES)
        record = events(tmp_path)
        (policy,) = [e for e in record if e["kind"] == "policy"]
        assert policy["params"]["disabled"] == [] and policy["messaging"] is True
        assert not [e for e in record if e["kind"] == "dropped"]
        sent = [e for e in record if e["kind"] == "sent"]
        assert len(sent) == MESSAGES and all("error" not in e for e in sent), sent
        assert {e["method"] for e in sent} == {"channels/incoming", "push/event"}  # both lanes
        assert len(items) == len(sent)
        by_id = {item.metadata["messageId"]: item for item in items}
        for entry in sent:
            item = by_id[entry["messageId"]]
            assert item.metadata["channelId"] == entry["channelId"], entry
            assert texts(item.content)[0] == item.metadata["sourceHeader"], texts(item.content)
            assert texts(item.content)[0].startswith(f"[source: discord / {entry['channelId']} · "), texts(item.content)
        # The quirks: a banner on stdout skipped, host/command refused, the DM channel announced later.
        assert logged(logs, "rpc.junk_line", connector="discord")
        assert logged(logs, "mcpl.refused", connector="discord", method="host/command", code=-32601)
        assert [e["answer"]["results"][0]["accepted"] for e in record if e["kind"] == "announced"] == [True]
        assert logged(logs, "connector.initialized", connector="discord", mcpl_version="0.4", legacy=True)

    async def test_it_honours_disabled_so_an_operator_deselection_silences_it(self, tmp_path) -> None:
        """With discord.messaging deselected by the operator the stub drops every message, as discord-mcpl does."""
        spec = discordish(tmp_path, feature_sets=FeatureSetSelection(disabled=["discord.messaging"]))
        async with running_host(config_with(tmp_path, spec)):
            await wait_for(lambda: done(tmp_path))
        record = events(tmp_path)
        (policy,) = [e for e in record if e["kind"] == "policy"]
        assert policy["params"]["disabled"] == ["discord.messaging"]
        assert len([e for e in record if e["kind"] == "dropped"]) == MESSAGES
        assert not [e for e in record if e["kind"] == "sent"]
        assert await stored_items(tmp_path) == []

    async def test_forced_0_5_rules_still_fail_closed_on_uses_outside_the_grant(self, tmp_path) -> None:
        """Under protocol = "0.5" a set whose uses exceed the grant is named in disabled (SPEC §6.4)."""
        spec = discordish(tmp_path, protocol="0.5")
        async with running_host(config_with(tmp_path, spec)):
            await wait_for(lambda: done(tmp_path))
        (policy,) = [e for e in events(tmp_path) if e["kind"] == "policy"]
        assert "discord.messaging" in policy["params"]["disabled"]


#: The grant with the two extensions the stub implements (docs/mcpl-compat.md#typing-and-acknowledge).
EXTENDED = [*GRANT, "channels.typing", "channels.acknowledge"]


class TestExtensions:
    """Typing, acknowledge and backscroll as discord-mcpl 0.1.4 answers them, driven through the host's own port."""

    async def test_typing_acknowledge_and_history_as_discord_mcpl_answers_them(self, tmp_path) -> None:
        spec = discordish(tmp_path, grant=EXTENDED)
        spec.env["DISCORD_HISTORY"] = "60"
        async with running_host(config_with(tmp_path, spec)) as host:
            await wait_for(lambda: done(tmp_path))
            port = host.connectors["discord"]
            random, general = "discord:g1:random", "discord:g1:general"
            await port.notify("channels/typing", {"channelId": random})  # no op: start
            await port.notify("channels/typing", {"channelId": random, "op": "stop"})
            acks = [await port.request("channels/acknowledge", params) for params in (
                {"channelId": random, "messageId": "m-1", "value": "  ✅ ", "intent": "seen"},
                {"channelId": random, "messageId": "m-1", "value": "", "intent": "seen"},
                {"channelId": random, "messageId": "m-404", "intent": "seen"},
                {"channelId": "discord:g9:nowhere", "messageId": "m-1", "intent": "seen"})]
            clamped = await port.open_channel(random, history=80)
            some = await port.open_channel(general, history=2)
            none = await port.open_channel(general)
            await wait_for(lambda: len([e for e in events(tmp_path) if e["kind"] == "typing"]) == 2)
        record = events(tmp_path)
        assert [(e["op"], e["indicator"]) for e in record if e["kind"] == "typing"] == [("start", True),
                                                                                        ("stop", False)]
        assert acks[0] == {"acknowledged": True, "representation": "✅"}
        assert acks[1] == {"acknowledged": True, "representation": "👀"}  # empty means 👀
        assert acks[2]["acknowledged"] is False and "m-404" in acks[2]["reason"]
        assert acks[3]["acknowledged"] is False and "nowhere" in acks[3]["reason"]
        # Backscroll: clamped to the stub's cap and said; the newest entries; none unless asked.
        assert len(clamped.history or []) == 50 and clamped.historyTruncated is True
        newest = json.loads(bytes((some.history or [])[-1]))
        assert newest["channelId"] == "discord:g1:general" and newest["messageId"] == "m-4"  # its last delivered
        assert len(some.history or []) == 2 and some.historyTruncated is False
        assert none.history is None and none.backscroll() == []

    async def test_with_the_extensions_granted_even_0_5_rules_enable_the_messaging_set(self, tmp_path) -> None:
        """The legacy `disabled` rule's consequence: a grant with typing, acknowledge and streaming covers
        discord.messaging's `uses`, so strict rules enable it too; the rule matters only for a narrower grant."""
        spec = discordish(tmp_path, grant=[*EXTENDED, "channels.streaming"], protocol="0.5")
        async with running_host(config_with(tmp_path, spec)):
            await wait_for(lambda: done(tmp_path))
            await items_when(tmp_path, MESSAGES)
        (policy,) = [e for e in events(tmp_path) if e["kind"] == "policy"]
        assert policy["params"]["disabled"] == [] and policy["messaging"] is True
