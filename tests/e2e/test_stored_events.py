"""Stored events end to end (open_host's `events=`): a real connector's items arrive as Stored events with their row ids."""

from __future__ import annotations

from pathlib import Path

import anyio

from mcplhost.host import open_host
from mcplhost.inbound.conversation import conversation_id
from mcplhost.ingest import Stored, stored_event_stream

from ..builders import incoming, message, register
from ..harness import CHAT_GRANT, CHAT_MANIFEST, config_with, record, scripted, stored_items, wait_for


class TestStoredEvents:
    async def test_each_committed_item_is_one_event_and_the_stream_ends_with_the_host(self, tmp_path: Path):
        """Two messages and a redelivery give two events, ids as stored; after the stop the stream ends."""
        steps = [register("disc:room"), incoming(message("disc:room", "m-1"), message("disc:room", "m-2", "again")),
                 incoming(message("disc:room", "m-1"))]
        spec = scripted("disc", {"manifest": CHAT_MANIFEST, "steps": steps}, tmp_path, grant=CHAT_GRANT)
        send, events = stored_event_stream()
        received: list[Stored] = []
        stop = anyio.Event()

        async def consume() -> None:
            async with events:
                async for event in events:
                    received.append(event)

        async with open_host(config_with(tmp_path, spec), events=send) as host, anyio.create_task_group() as tg:
            tg.start_soon(consume)
            tg.start_soon(host.run, stop)
            await wait_for(lambda: record(tmp_path, "disc").done)
            stop.set()
        rows = await stored_items(tmp_path)
        assert [e.id for e in received] == [item.id for item in rows] and len(rows) == 2
        assert {e.item.conversation_id for e in received} == {conversation_id("disc", "disc:room", None)}
        assert host.ingest.statistics()["stored_events_dropped"] == 0
