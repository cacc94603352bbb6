"""The Zulip-shaped stub under the real host: topics are threads, and a publish comes back as its echo (stage.py)."""

from __future__ import annotations

from mcplhost.config import ConnectorConfig, RestartConfig
from mcplhost.inbound.conversation import conversation_id

from ..builders import texts
from ..harness import PYTHON, REPO, config_with, items_when, running_host

GRANT = ["channels.register", "channels.incoming"]


def zulipish(**env: str) -> ConnectorConfig:
    return ConnectorConfig(name="zulip", command=[PYTHON, "-m", "mcplhost.connectors.zulipish"],
                           env={"PYTHONPATH": str(REPO), "ZULIP_DELAY_S": "0.01", "ZULIP_INTERVAL_S": "0.01", **env},
                           cwd=str(REPO), grant=GRANT, restart=RestartConfig(policy="never"), request_timeout_s=5.0)


class TestZulipish:
    async def test_each_message_is_stored_in_its_stream_s_topic_thread(self, tmp_path) -> None:
        """Every staged message carries its topic as the thread, so its conversation is the topic's."""
        async with running_host(config_with(tmp_path, zulipish())):
            items = await items_when(tmp_path, 3)
        assert [(i.metadata["channelId"], i.metadata["threadId"]) for i in items] == [
            ("zulip:engineering", "deploys"), ("zulip:engineering", "deploys"), ("zulip:social", "kitchen")]
        assert "chat:mention" in items[1].metadata["tags"]

    async def test_a_publish_is_answered_with_a_message_id_and_delivered_back_in_its_thread(self, tmp_path) -> None:
        """channels/publish to a topic's conversation answers {delivered, messageId}, then that message arrives."""
        async with running_host(config_with(tmp_path, zulipish(ZULIP_MESSAGES="1"))) as host:
            await items_when(tmp_path, 1)
            # The stub learns a conversation's topic from the host's answer to its push, as Zulip's connector
            # would: a ping it answers after that answer (lines are handled in order) makes sure it has it.
            await host.connectors["zulip"].request("ping", {})
            answer = await host.connectors["zulip"].request("channels/publish", {
                "conversationId": conversation_id("zulip", "zulip:engineering", "deploys"),
                "channelId": "zulip:engineering", "stream": False,
                "content": [{"type": "text", "text": "Noted."}]})
            items = await items_when(tmp_path, 2)
        assert answer == {"delivered": True, "messageId": "z-1"}
        echo = items[-1]
        assert echo.participant == "Scout" and echo.metadata["messageId"] == "z-1"
        assert echo.metadata["threadId"] == "deploys" and texts(echo.content)[-1] == "Noted."
