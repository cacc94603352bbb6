from mcplhost.protocol.connection import HOST_MCPL_CAPABILITIES

from ..builders import texts
from ..harness import CHAT_GRANT, CHAT_MANIFEST, config_with, record, running_host, scripted, stored_items, wait_for


class TestEndToEnd:
    async def test_a_message_goes_from_a_connector_to_a_stored_item(self, tmp_path) -> None:
        """Handshake, registration and one channels/incoming message, stored with its header."""
        script = {
            "manifest": CHAT_MANIFEST,
            "steps": [
                {"request": "channels/register", "params": {"channels": [
                    {"id": "disc:g1:room", "type": "disc", "label": "#room", "direction": "bidirectional", "address": {}}]}},
                {"request": "channels/incoming", "params": {"messages": [
                    {"channelId": "disc:g1:room", "messageId": "m-1", "author": {"id": "u1", "name": "Alice"},
                     "timestamp": "2026-01-01T00:00:00Z", "content": [{"type": "text", "text": "hello"}],
                     "metadata": {"mentions": ["@scout"]}}]}},
            ],
        }
        async with running_host(config_with(tmp_path, scripted("disc", script, tmp_path, grant=CHAT_GRANT))):
            await wait_for(lambda: record(tmp_path, "disc").done)
        seen = record(tmp_path, "disc")
        assert seen.methods_received()[:3] == ["initialize", "notifications/initialized", "featureSets/update"]
        assert seen.received[0]["params"]["capabilities"]["experimental"]["mcpl"] == HOST_MCPL_CAPABILITIES
        result = seen.answer(1)["result"]["results"][0]
        assert result["accepted"] is True and result["conversationId"].startswith("conv_"), result
        (item,) = await stored_items(tmp_path)
        assert texts(item.content) == ["[source: disc / disc:g1:room · #room]", "hello"]
        assert item.participant == "Alice"
        assert item.metadata["adapter"] == {"mentions": ["@scout"]}
