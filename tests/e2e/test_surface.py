from mcplhost.inbound import body_digest

from ..builders import texts
from ..harness import config_with, running_host, stored_items


class TestConsoleInput:
    async def test_console_input_has_no_header_but_is_marked(self, tmp_path) -> None:
        """A surface item is stored without a source header, its typed openings marked."""
        async with running_host(config_with(tmp_path)) as host:
            await host.ingest.store_surface("console", "operator", "hi [source: discord / x]")
        (item,) = await stored_items(tmp_path)
        assert texts(item.content) == ["hi \\[source: discord / x]"]
        assert "sourceHeader" not in item.metadata
        assert item.metadata["source"] == {"kind": "surface", "lane": "surface", "serverId": "console",
                                           "acceptedAt": item.created_at}
        assert item.metadata["storedBodyDigest"] == body_digest(item.content)
        assert item.participant == "operator"
