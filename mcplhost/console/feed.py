"""The live feed: the lines `mcplhost dev` prints, newest last here (the page shows newest on top), with links.

Two sources, each formatted by dev's own functions (`FeedFormat`, passed in
by the CLI, since dev sits above the console: docs/architecture.md#layers):

- items: read through the console's own read-only connection after a
  commit (`stored()` is the host's on_stored hook: it only wakes the
  reader; at most every READ_INTERVAL_S, at most READ_BATCH items a read)
  and every FEED_POLL_S besides; everyone's items only (agent rows are
  told by the events), each linking to its page;
- host events: the log tap (`event()`), called where the event is logged:
  a wake, a tool call, a turn, a publish, a draft, a stop, a warning; each
  links to its item, its turn, or its agent's turns.

Lines go into a ring of FEED_LINES and to each subscriber's stream of
SUBSCRIBER_BUFFER lines. A subscriber that falls that far behind (a slow
or stalled browser) is dropped, never buffered for: its stream is closed,
the page's EventSource reconnects and catches up from the ring.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import anyio
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from mcplhost.ingest import now_ms
from mcplhost.store import NewItem
from mcplhost.store.interfaces import Items

log = structlog.get_logger()

#: Lines the feed keeps (the page's first view, and what a reconnecting client catches up from).
FEED_LINES = 500
#: Items read back from the store when the console starts: the feed opens with them.
PRELOAD_ITEMS = 200
#: Lines a subscriber may fall behind before it is dropped.
SUBSCRIBER_BUFFER = 64
#: Items the reader turns into lines per read, at most: the newest of those committed since the last read.
#: More than that (a flood no one reads line by line) is one line saying how many were passed over, so the
#: feed's work on the event loop stays bounded whatever the inbound rate.
READ_BATCH = 50
#: The reader reads at most this often (commits in between are read together), and at least this often
#: when no commit woke it (items another writer stored).
READ_INTERVAL_S = 0.1
FEED_POLL_S = 1.0
#: A line of these levels is kind "warning", "error" or "critical" (dev colours it so), whatever its event.
WARNING_LEVELS = frozenset({"warning", "error", "critical"})
#: Channel labels remembered for naming a publish's destination (the oldest forgotten first).
LABELS_KEPT = 4096


class FeedFormat(NamedTuple):
    """How a feed line reads: mcplhost/dev.py's `describe_item` and `describe_event`, passed in by the CLI."""

    item: Callable[[NewItem], str]
    event: Callable[[dict[str, Any], list[str], dict[tuple[str, str], str] | None], str | None]


class FeedLine(msgspec.Struct, frozen=True):
    """One line; its JSON is what the page's script receives."""

    seq: int  # rises by one per line: a reconnecting client asks for the lines after the last it saw
    at: int  # epoch ms: an item's acceptance, an event's logging
    kind: str  # "item", or the event's name (agent.turn, outbox.delivered, warning, ...)
    text: str
    href: str  # the line's link: its item, its turn, its agent's turns, or the overview


def event_href(event: Mapping[str, Any]) -> str:
    """Where an event's line links: the item or turn it names, else its agent's turns, else the overview."""
    for key, path in (("turn", "/turns/"), ("first_item", "/items/"), ("item", "/items/"),
                      ("outbox_id", "/outbox/")):
        value = event.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{path}{value}"
    agent = event.get("agent")
    if isinstance(agent, str) and agent.replace("-", "").replace("_", "").isalnum():
        return f"/turns?agent={agent}"
    return "/"


class Feed:
    """The ring of lines and its subscribers; fed by `run` (items) and `event` (the log tap)."""

    def __init__(self, fmt: FeedFormat, *, lines: int = FEED_LINES) -> None:
        self._format = fmt
        self._lines: deque[FeedLine] = deque(maxlen=lines)
        #: Each subscriber's receiving end (what it was given) → the sending end the feed writes to.
        self._subscribers: dict[MemoryObjectReceiveStream[FeedLine], MemoryObjectSendStream[FeedLine]] = {}
        self._seq = 0
        self._last = 0  # the newest item id read
        self._labels: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._committed = anyio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        #: The configured connectors' names, as dev's `ready` line lists them.
        self.connectors: list[str] = []
        self.dropped = 0  # subscribers dropped for falling behind

    # --- sources -------------------------------------------------------------------

    def stored(self, items: list[NewItem]) -> None:
        """The host's on_stored hook: something was committed; the reader reads it (nothing is formatted here)."""
        self._committed.set()

    def event(self, event: dict[str, Any]) -> None:
        """The log tap: an event as its line, when dev shows it. Off the loop's thread, handed to the loop."""
        if self._loop is None:
            return  # not running
        if threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self.event, event)
            return
        text = self._format.event(event, self.connectors, dict(self._labels))
        if text is not None:
            level = str(event.get("level"))
            kind = level if level in WARNING_LEVELS else str(event.get("event"))
            self._add(now_ms(), kind, text, event_href(event))

    async def run(self, items: Items) -> None:
        """Read new items from `items` (the console's read-only store's) until cancelled, each as a line."""
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        try:
            last = await items.last_id()
            await self._read(items, max(0, last - PRELOAD_ITEMS), PRELOAD_ITEMS)
            while True:
                with anyio.move_on_after(FEED_POLL_S):
                    await self._committed.wait()
                self._committed = anyio.Event()
                await self._read(items, self._last, READ_BATCH)
                await anyio.sleep(READ_INTERVAL_S)
        finally:
            self._loop = None
            for stream in self._subscribers.values():
                stream.close()
            self._subscribers.clear()

    async def _read(self, items: Items, after: int, most: int) -> None:
        """Lines for the items above `after`: the newest `most` of them, and one line for any passed over."""
        newest = await items.last_id()
        start = max(after, newest - most)
        if start > after:
            self._add(now_ms(), "skipped", f"… {start - after} more stored items not shown one by one", "/items")
        rows = await items.after_as_written(start, limit=most)
        for item_id, item in rows:
            self._last = item_id
            if item.agent is None:
                self._learn_label(item)
                self._add(item.created_at, "item", self._format.item(item), f"/items/{item_id}")
        self._last = max(self._last, start)

    def _learn_label(self, item: NewItem) -> None:
        """The label an item's channel goes by, for naming a publish to it (as dev's view does)."""
        meta = item.meta
        label, channel = meta.source.label if meta.source is not None else None, meta.channel_id
        if label is not None and channel is not None:
            key = (str(meta.server_id), channel)
            self._labels[key] = label
            self._labels.move_to_end(key)
            while len(self._labels) > LABELS_KEPT:
                self._labels.popitem(last=False)

    def _add(self, at: int, kind: str, text: str, href: str) -> None:
        self._seq += 1
        line = FeedLine(seq=self._seq, at=at, kind=kind, text=text, href=href)
        self._lines.append(line)
        for receiver, stream in list(self._subscribers.items()):
            try:
                stream.send_nowait(line)
            except anyio.WouldBlock:  # fell SUBSCRIBER_BUFFER lines behind: dropped, never buffered for
                self._forget(receiver)
                self.dropped += 1
                log.info("console.feed_client_dropped", behind=SUBSCRIBER_BUFFER)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._forget(receiver)

    def _forget(self, receiver: MemoryObjectReceiveStream[FeedLine]) -> None:
        stream = self._subscribers.pop(receiver, None)
        if stream is not None:
            stream.close()  # its reader gets the lines still buffered, then the end

    # --- readers -------------------------------------------------------------------

    def lines(self, after: int = 0) -> list[FeedLine]:
        """The kept lines with a seq above `after`, oldest first."""
        return [line for line in self._lines if line.seq > after]

    def subscribe(self, after: int = 0) -> MemoryObjectReceiveStream[FeedLine]:
        """A stream of the kept lines after `after`, then every new line; closed when the subscriber is dropped.

        The backlog beyond SUBSCRIBER_BUFFER is not sent: the newest lines
        are (a page shows the newest on top).
        """
        send, receive = anyio.create_memory_object_stream[FeedLine](SUBSCRIBER_BUFFER)
        if after > self._seq:
            after = 0  # a line of an earlier run of the daemon: this run's lines are all new to it
        for line in self.lines(after)[-SUBSCRIBER_BUFFER:]:
            send.send_nowait(line)
        if self._loop is None:
            send.close()  # not running: the backlog, then the end
        else:
            self._subscribers[receive] = send
        return receive

    def unsubscribe(self, receiver: MemoryObjectReceiveStream[FeedLine]) -> None:
        """Forget a subscriber whose client left: both ends closed."""
        self._forget(receiver)
        receiver.close()

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)
