"""What each page shows, read for it: the status object, the store's rows, explain, search (docs/operations.md#console).

Every read goes through the console's own read-only connection (`reads`,
opened with `open_reader`: WAL, it never takes the writer's lock nor one of
the daemon's reader connections) or through the control service's
`status()`, the very object `mcplhost status --json` prints. Nothing here
writes, and every list is bounded (a page's rows, an id window).

The status object is handed to the templates as JSON-shaped builtins (its
keys spelled as `status --json` spells them), so a field another part of
the host adds to it shows up on the overview without a change here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import anyio
import msgspec

from mcplhost.agents.wakes.explain import Explanation, explain_item
from mcplhost.config import AgentConfig
from mcplhost.control.status import Status
from mcplhost.control.wire import Answer, Request
from mcplhost.ingest import now_ms
from mcplhost.jsonobject import JsonObject
from mcplhost.store import Store, StoredItem, Turn
from mcplhost.store.outbox import OutboxRow
from mcplhost.store.quotas import QUOTA_BUCKET_MS, QUOTA_WINDOW_BUCKETS, oldest_bucket
from mcplhost.store.readers import SearchError, search_items, stopped_early_warning, timed_out_warning
from mcplhost.store.rows import (
    DraftMeta,
    FailedReplyNotice,
    PeerMeta,
    SpeechMeta,
    ToolCallMeta,
    ToolResultMeta,
    TurnFailedNotice,
)
from mcplhost.store.turns import DAY_MS, spent_tokens

from .charts import Chart, bar_chart

#: Rows a list page shows (turns, outbox states, drafts per agent, items).
PAGE_ROWS = 100
#: Search hits shown, and how long one search may take (within the request's own time bound).
SEARCH_LIMIT = 50
SEARCH_DEADLINE_S = 5.0
#: Days in the turns and tokens charts.
CHART_DAYS = 7
#: The status object is read at most this often, however many pages and live overviews ask.
STATUS_CACHE_S = 1.0


class Operated(Protocol):
    """What the console asks of the running host: the control service's two answers (mcplhost/control/responder.py)."""

    async def status(self) -> Status: ...

    async def answer(self, request: Request) -> Answer: ...


class Block(msgspec.Struct, frozen=True):
    """One stored content block as the item page shows it: its text, or the block as JSON when it is not text."""

    index: int
    part: str  # "header" (the stored source header) or "body"
    type: str
    text: str


class ItemView(msgspec.Struct, frozen=True):
    item: StoredItem
    blocks: list[Block]
    metadata_json: str
    server: str | None
    channel: str | None
    label: str | None
    thread: str | None
    lane: str | None
    explanations: list[Explanation]


class TurnRow(msgspec.Struct, frozen=True):
    """One row a turn wrote: a tool call or result, speech, a draft."""

    item: StoredItem
    kind: str
    detail: str  # the tool and its arguments, a destination, a draft's reason
    texts: list[str]


class TurnView(msgspec.Struct, frozen=True):
    turn: Turn
    tokens: int
    waking: list[StoredItem]
    rows: list[TurnRow]
    publishes: list[OutboxRow]


class DraftView(msgspec.Struct, frozen=True):
    item: StoredItem
    turn_id: int | None
    reason: str | None
    explain_item: int | None  # the turn's first waking item: its page explains the wake


class SearchView(msgspec.Struct, frozen=True):
    query: str
    hits: list[dict[str, Any]]
    error: str | None
    warnings: list[str]


class Overview(msgspec.Struct, frozen=True):
    status: dict[str, Any]  # as `status --json` prints it
    tokens_24h: dict[str, int]  # agent → tokens its turns spent in the last 24 hours (max_tokens_per_day's window)
    item_charts: list[Chart]
    turn_charts: list[Chart]
    token_charts: list[Chart]


def clock(epoch_ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch_ms / 1000))


def day(epoch_ms: int) -> str:
    return time.strftime("%m-%d", time.gmtime(epoch_ms / 1000))


def blocks_of(item: StoredItem) -> list[Block]:
    """The stored content, block by block: the header blocks (each exactly `metadata.sourceHeader`), then the body."""
    header = item.meta.source_header
    header_block = {"type": "text", "text": header} if header is not None else None
    blocks, in_header = [], True
    for index, block in enumerate(item.content):
        in_header = in_header and block == header_block
        text = block.get("text")
        shown = text if block.get("type") == "text" and isinstance(text, str) else msgspec.json.encode(block).decode()
        blocks.append(Block(index=index, part="header" if in_header else "body", type=str(block.get("type")),
                            text=shown))
    return blocks


def turn_row(item: StoredItem) -> TurnRow:
    host = item.host
    kind = item.role if host is None or isinstance(host, PeerMeta) else host.kind
    match host:
        case ToolCallMeta(tool=tool, arguments=arguments):
            detail = f"{tool} {msgspec.json.encode(arguments).decode()}"
        case ToolResultMeta(tool=tool, is_error=is_error):
            detail = f"{tool}" + (" (error)" if is_error else "")
        case SpeechMeta(destination=where):
            detail = f"→ {where.server_id}/{where.channel_id}" if where is not None else "no destination"
        case DraftMeta(reason=reason) | TurnFailedNotice(reason=reason) | FailedReplyNotice(reason=reason):
            detail = reason or ""
        case _:
            detail = ""
    texts = [b["text"] if b.get("type") == "text" and isinstance(b.get("text"), str) else
             msgspec.json.encode(b).decode() for b in item.content]
    return TurnRow(item=item, kind=kind, detail=detail, texts=texts)


class Views:
    """The pages' reads over the console's read-only store, the host's status and its agents' current config."""

    def __init__(self, reads: Store, operated: Operated, agents: Callable[[], Sequence[AgentConfig]], *,
                 clock_ms: Callable[[], int] = now_ms) -> None:
        self.reads = reads
        self.operated = operated
        self.agents = agents
        self.clock_ms = clock_ms
        self._status: tuple[float, dict[str, Any]] | None = None
        self._status_lock = anyio.Lock()

    async def status(self) -> JsonObject:
        """The status object as `status --json` prints it, read again once STATUS_CACHE_S has passed."""
        async with self._status_lock:
            now = time.monotonic()
            if self._status is None or now - self._status[0] >= STATUS_CACHE_S:
                self._status = (now, msgspec.to_builtins(await self.operated.status()))
            return self._status[1]

    async def overview(self) -> Overview:
        status = await self.status()
        now = self.clock_ms()
        first_minute = oldest_bucket(now)
        item_charts = []
        for connector in status.get("connectors", []):
            name = connector["name"]
            counts = {u.bucket_start: u.items for u in await self.reads.quotas.usage_since(name, first_minute)}
            minutes = [first_minute + i * QUOTA_BUCKET_MS for i in range(QUOTA_WINDOW_BUCKETS)]
            item_charts.append(bar_chart(f"{name}: items per minute, last hour",
                                         [(clock(m)[:5], counts.get(m, 0)) for m in minutes], "items"))
        today = now - now % DAY_MS
        days = [today - (CHART_DAYS - 1 - i) * DAY_MS for i in range(CHART_DAYS)]
        turn_charts, token_charts, tokens_24h = [], [], {}
        for agent in status.get("agents", []):
            name = agent["name"]
            per_day = {start: (ran, tokens) for start, ran, tokens in await self.reads.turns.daily(name, days[0])}
            turn_charts.append(bar_chart(f"{name}: turns per day (UTC), last week",
                                         [(day(d), per_day.get(d, (0, 0))[0]) for d in days], "turns"))
            token_charts.append(bar_chart(f"{name}: tokens per day (UTC), last week",
                                          [(day(d), per_day.get(d, (0, 0))[1]) for d in days], "tokens"))
            tokens_24h[name] = await self.reads.turns.usage_since(name, now - DAY_MS)
        return Overview(status=status, tokens_24h=tokens_24h, item_charts=item_charts, turn_charts=turn_charts,
                        token_charts=token_charts)

    async def item(self, item_id: int) -> ItemView | None:
        found = await self.reads.items.get_many([item_id])
        if not found:
            return None
        item = found[0]
        meta, source = item.meta, item.meta.source
        explanations = await explain_item(self.reads, list(self.agents()), item_id) or []
        # The page shows the metadata whole too, as stored: the one place it is a dict again, like the export.
        return ItemView(item=item, blocks=blocks_of(item),
                        metadata_json=msgspec.json.format(msgspec.json.encode(item.metadata), indent=2).decode(),
                        server=meta.server_id or (source.server_id if source is not None else None),
                        channel=meta.channel_id or (source.channel_id if source is not None else None),
                        label=source.label if source is not None else None, thread=meta.thread_id,
                        lane=source.lane if source is not None else None, explanations=explanations)

    async def turn(self, turn_id: int) -> TurnView | None:
        turn = await self.reads.turns.get(turn_id)
        if turn is None:
            return None
        waking = await self.reads.items.get_many(turn.wake_item_ids[:PAGE_ROWS])
        after = min(turn.wake_item_ids, default=1) - 1
        rows = await self.reads.items.turn_rows(turn.agent, turn.id, after=after)
        return TurnView(turn=turn, tokens=spent_tokens(turn.usage), waking=waking,
                        rows=[turn_row(row) for row in rows], publishes=await self.reads.outbox.of_turn(turn.id))

    async def turns(self, agent: str | None) -> list[Turn]:
        """The newest turns (of one agent, or all), newest first."""
        return list(reversed(await self.reads.turns.list(agent=agent, limit=PAGE_ROWS)))

    async def outbox(self, agent: str | None) -> dict[str, list[OutboxRow]]:
        """Pending and failed publishes, newest first."""
        return {state: await self.reads.outbox.newest(state, PAGE_ROWS, agent=agent) for state in ("pending", "failed")}

    async def publish(self, outbox_id: int) -> OutboxRow | None:
        return await self.reads.outbox.get(outbox_id)

    async def drafts(self, agent: str | None) -> list[DraftView]:
        names = [a.name for a in self.agents() if agent is None or a.name == agent]
        found: list[StoredItem] = []
        for name in names:
            found += await self.reads.items.recent_drafts(name, PAGE_ROWS)
        found.sort(key=lambda item: item.id, reverse=True)
        first_wake: dict[int, int | None] = {}
        views = []
        for item in found[:PAGE_ROWS]:
            draft = item.host if isinstance(item.host, DraftMeta) else DraftMeta()
            turn_id = draft.turn_id
            if turn_id is not None and turn_id not in first_wake:
                turn = await self.reads.turns.get(turn_id)
                first_wake[turn_id] = min(turn.wake_item_ids, default=None) if turn is not None else None
            views.append(DraftView(item=item, turn_id=turn_id, reason=draft.reason,
                                   explain_item=first_wake.get(turn_id) if turn_id is not None else None))
        return views

    async def items(self, *, connector: str | None, channel: str | None, before: int | None) -> list[StoredItem]:
        return await self.reads.items.newest(PAGE_ROWS, before=before, server_id=connector, channel=channel)

    async def search(self, query: str, *, as_regex: bool, ignore_case: bool) -> SearchView:
        """`mcplhost search`'s search (bodies only, newest first), bounded by SEARCH_DEADLINE_S."""
        try:
            result = await search_items(self.reads, query, as_regex=as_regex, ignore_case=ignore_case,
                                        limit=SEARCH_LIMIT, deadline_s=SEARCH_DEADLINE_S)
        except SearchError as exc:
            return SearchView(query=query, hits=[], error=str(exc), warnings=[])
        warnings = [w for w in (timed_out_warning(result), stopped_early_warning(result, SEARCH_DEADLINE_S)) if w]
        return SearchView(query=query, hits=result.hits, error=None, warnings=warnings)
