"""The live feed (mcplhost/console/feed.py) and its event stream (streams.py): dev's lines, links, and bounds.

Items come from a real store through the real pipeline (tests/agents/support.py);
events come through the tap as a log call would hand them over.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio

from mcplhost.cli.serve import console_lines
from mcplhost.console.feed import SUBSCRIBER_BUFFER, Feed, event_href
from mcplhost.console.streams import FeedEvents
from mcplhost.dev import describe_event
from mcplhost.secrets import Secrets

from ..agents.support import agent_store, heard

TURN = {"event": "agent.turn", "agent": "scout", "turn": 7, "outcome": "completed", "seconds": 0.5, "level": "info"}


async def running_feed(feed: Feed, store: Any, tg: anyio.abc.TaskGroup) -> None:
    tg.start_soon(feed.run, store.items)
    with anyio.fail_after(5):
        while feed._loop is None:  # noqa: SLF001  (started: it reads the store and takes events)
            await anyio.sleep(0.005)


class TestLines:
    async def test_items_are_dev_s_lines_linking_to_their_pages(self, tmp_path: Path) -> None:
        """Each item committed after the feed started is one line, as dev prints it, linking to /items/ID."""
        async with agent_store(tmp_path) as (store, _writer, ingest), anyio.create_task_group() as tg:
            feed = Feed(console_lines())
            await running_feed(feed, store, tg)
            with feed.subscribe() as received:
                ids = await heard(ingest, "first <b>words</b>", "second")
                feed.stored([])  # the host's on_stored hook: a commit happened
                with anyio.fail_after(5):
                    lines = [await received.receive(), await received.receive()]
            tg.cancel_scope.cancel()
        assert [line.href for line in lines] == [f"/items/{i}" for i in ids]
        assert lines[0].kind == "item" and lines[0].text.endswith("Alice: first <b>words</b>")
        assert [line.seq for line in lines] == [1, 2]

    async def test_events_are_dev_s_lines_linking_to_their_turn(self, tmp_path: Path) -> None:
        """A logged event dev shows is a line; one it leaves out is none; a warning is kind "warning"."""
        async with agent_store(tmp_path) as (store, _writer, _ingest), anyio.create_task_group() as tg:
            feed = Feed(console_lines())
            await running_feed(feed, store, tg)
            feed.event(TURN)
            feed.event({"event": "connector.spawned", "level": "info", "connector": "x"})
            feed.event({"event": "connector.crashed", "level": "warning", "connector": "x"})
            tg.cancel_scope.cancel()
        turn, warning = feed.lines()
        assert (turn.text, turn.href, turn.kind) == (describe_event(TURN, []), "/turns/7", "agent.turn")
        assert (warning.kind, warning.href) == ("warning", "/")

    async def test_an_event_logged_off_the_loop_is_handed_to_it(self, tmp_path: Path) -> None:
        async with agent_store(tmp_path) as (store, _writer, _ingest), anyio.create_task_group() as tg:
            feed = Feed(console_lines())
            await running_feed(feed, store, tg)
            with feed.subscribe() as received:
                worker = threading.Thread(target=feed.event, args=(TURN,))
                worker.start()
                with anyio.fail_after(5):
                    line = await received.receive()
                worker.join()
            tg.cancel_scope.cancel()
        assert line.href == "/turns/7"

    def test_event_links(self) -> None:
        """The turn, then the item, then the publish an event names; else its agent's turns; else the overview."""
        assert event_href({"turn": 3, "first_item": 9}) == "/turns/3"
        assert event_href({"first_item": 9, "agent": "scout"}) == "/items/9"
        assert event_href({"outbox_id": 4}) == "/outbox/4"
        assert event_href({"agent": "scout", "turn": True}) == "/turns?agent=scout"
        assert event_href({"agent": "a/../b"}) == "/" and event_href({}) == "/"


class TestSlowClients:
    async def test_a_subscriber_that_falls_behind_is_dropped_not_buffered_for(self, tmp_path: Path) -> None:
        """Past SUBSCRIBER_BUFFER unread lines its stream is closed: it reads what was buffered, then the end;
        a subscriber that keeps up is untouched."""
        async with agent_store(tmp_path) as (store, _writer, _ingest), anyio.create_task_group() as tg:
            feed = Feed(console_lines())
            await running_feed(feed, store, tg)
            with feed.subscribe() as slow, feed.subscribe() as quick:
                got = []
                for n in range(SUBSCRIBER_BUFFER + 5):
                    feed.event({**TURN, "turn": n})
                    got.append(await quick.receive())
                assert feed.dropped == 1 and feed.subscribers == 1
                read = [line async for line in slow]
            tg.cancel_scope.cancel()
        assert len(read) == SUBSCRIBER_BUFFER and len(got) == SUBSCRIBER_BUFFER + 5

    async def test_a_stream_whose_client_stops_reading_ends(self, tmp_path: Path) -> None:
        """/feed/events gives each write SEND_TIMEOUT_S (here short): a client that takes none is let go."""
        async with agent_store(tmp_path) as (store, _writer, _ingest), anyio.create_task_group() as tg:
            feed = Feed(console_lines())
            await running_feed(feed, store, tg)
            feed.event(TURN)
            stream = FeedEvents(feed, Secrets(), send_timeout_s=0.05)
            sent: list[dict[str, Any]] = []

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)
                if len(sent) > 2:  # the head and the retry line went out; then the client stops reading
                    await anyio.sleep_forever()

            async def receive() -> dict[str, Any]:
                await anyio.sleep_forever()
                raise AssertionError

            with anyio.fail_after(5):
                await stream({"type": "http", "headers": [], "query_string": b""}, receive, send)
            tg.cancel_scope.cancel()
        assert stream.open == 0 and feed.subscribers == 0 and sent[0]["status"] == 200

    async def test_past_the_cap_a_stream_is_503(self, tmp_path: Path) -> None:
        stream = FeedEvents(Feed(console_lines()), Secrets(), max_streams=0)
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await stream({"type": "http", "headers": [], "query_string": b""}, None, send)  # type: ignore[arg-type]
        assert sent[0]["status"] == 503

    async def test_secrets_are_withheld_from_the_stream(self, tmp_path: Path) -> None:
        """A line holding a configured secret's value goes out with it redacted."""
        async with agent_store(tmp_path) as (store, _writer, _ingest), anyio.create_task_group() as tg:
            feed = Feed(console_lines())
            await running_feed(feed, store, tg)
            feed.event({"event": "connector.crashed", "level": "error", "connector": "x",
                        "error": "token=sekrit-value-123 rejected"})
            stream = FeedEvents(feed, Secrets({"X_TOKEN": "sekrit-value-123"}), send_timeout_s=1.0)
            sent: list[bytes] = []

            async def send(message: dict[str, Any]) -> None:
                sent.append(message.get("body", b""))
                if len(sent) >= 3:
                    raise OSError("enough")  # the client went away

            async def receive() -> dict[str, Any]:
                await anyio.sleep_forever()
                raise AssertionError

            await stream({"type": "http", "headers": [], "query_string": b""}, receive, send)
            tg.cancel_scope.cancel()
        body = b"".join(sent)
        assert b"sekrit-value-123" not in body and b"[redacted:X_TOKEN]" in body


class TestBoundary:
    async def test_a_failing_part_of_the_console_is_logged_once_and_ends_alone(self) -> None:
        """The server's or the feed's exception stops that part, logged once; it never reaches the host."""
        from structlog.testing import capture_logs

        from mcplhost.console.component import _boundary

        async def broken() -> None:
            raise RuntimeError("a bug in the console")

        with capture_logs() as logs:
            await _boundary("feed", broken)
        assert [(e["event"], e["part"]) for e in logs] == [("console.failed", "feed")]
