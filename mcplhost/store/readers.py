"""Readers of what was said: they read bodies only, never the source header (docs/provenance.md §7).
Also the plain views of the turns ledger (`mcplhost turns`) and the outbox (`mcplhost outbox`).

`search_items` is untrusted CPU work (the query may be a model's, steered
by a chat user), so none of it runs on the event loop: compiling, reading,
decoding and matching all happen in a worker thread with its own read-only
connection (it takes no lock and holds up no commit). What it tests comes
newest first from the store (store/search_reader.py): the rows above the
search index's mark, then, for a query that requires 3 or more characters
in a row (store/search_query.py), only the index's candidates, else every
row as before the index; the filter (`SearchFilter`) is part of each
statement. It stops at `limit` hits. One deadline bounds the whole search;
each match gets at most REGEX_TIMEOUT_S of what is left. When the deadline
comes first the search returns what it found so far and says so
(`SearchResult.stopped_early`); a cancelled caller stops the worker at its
next row (or statement step). A regular expression that runs out of time on
an item (or out of the memory `regex` allows a match, which a repeated fuzzy
group such as `(?>(?:é{i<=1,d<=1})+)` reaches within a second on a short
body) is not a silent miss: the item is counted in
`SearchResult.timed_out`, for the caller to report. docs/operations.md#searching
says the same for users.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import msgspec
import regex

from mcplhost.inbound.quoting import header_value

from .composed import Store
from .items import StoredItem
from .outbox import OutboxRow
from .rows import PeerMeta
from .search_index import body_text
from .search_query import SearchFilter, required
from .search_reader import SearchInterrupted
from .turns import Turn, spent_tokens

T = TypeVar("T")

#: One search, every page and every match, gets this long; then it returns what it found so far.
SEARCH_DEADLINE_S = 10.0
#: A regular expression gets this long per item (never past the deadline) before the item is left out as timed out.
REGEX_TIMEOUT_S = 0.5
#: Longest query taken: compiling it is work the query's author controls.
QUERY_MAX_CHARS = 1000
#: Characters of context on each side of a hit in a snippet.
SNIPPET_CONTEXT = 40
#: Characters of the match itself a snippet shows (a match may be the whole body); the rest is cut with "…".
SNIPPET_MATCH_CHARS = 200
#: Ids of timed-out items kept for the report (the newest ones); the count is always exact.
TIMED_OUT_IDS_KEPT = 10
#: Waking item ids a plain `mcplhost turns` line shows; the rest are counted (a wake holds up to 100).
WAKE_IDS_SHOWN = 8


class SearchError(Exception):
    """The query cannot be used (e.g. an invalid regular expression)."""


class SearchResult(msgspec.Struct, frozen=True):
    """What a search found, and what it could not decide."""

    hits: list[dict[str, Any]]  # newest first
    searched: int  # items whose body was tested
    timed_out: int  # items whose test ran out of time: they are not in `hits`, and could have been
    timed_out_ids: list[int]  # the newest of those (at most TIMED_OUT_IDS_KEPT), newest first
    #: The deadline came before `limit` hits or the oldest item: items older than `oldest_searched` were not searched.
    stopped_early: bool = False
    oldest_searched: int | None = None  # the oldest item tested (or timed out), None if none was


def _snippet(text: str, start: int, end: int) -> str:
    left = max(0, start - SNIPPET_CONTEXT)
    right = min(len(text), end + SNIPPET_CONTEXT)
    if end - start > SNIPPET_MATCH_CHARS:  # a long match: its head, then the context after its end
        middle = text[start : start + SNIPPET_MATCH_CHARS] + "…" + text[end:right]
        piece = text[left:start] + middle
    else:
        piece = text[left:right]
    return ("…" if left else "") + piece.replace("\n", " ") + ("…" if right < len(text) else "")


def compile_query(query: str, *, as_regex: bool, ignore_case: bool) -> regex.Pattern[str]:
    """The query as a pattern (a literal unless `as_regex`); SearchError if it is too long or not a valid expression."""
    if len(query) > QUERY_MAX_CHARS:
        raise SearchError(f"the query is {len(query)} characters long; at most {QUERY_MAX_CHARS} are taken")
    flags = regex.IGNORECASE | regex.FULLCASE if ignore_case else 0
    try:
        return regex.compile(query if as_regex else regex.escape(query), flags)
    except regex.error as exc:
        raise SearchError(f"invalid regular expression: {exc}") from None


class NewestHits:
    """The hits of a scan that runs newest first and stops at `limit` of them, and the timeouts met on the way.

    Pure bookkeeping, fed newest first: `hit(id, hit)`, `miss(id)`, `timeout(id)` until `full`, then `result()`.
    Each timeout is met before the window is full, so each could have been
    one of its hits: all are reported.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._hits: list[dict[str, Any]] = []
        self._timed_out_ids: list[int] = []
        self._timed_out = 0
        self.searched = 0
        self.oldest: int | None = None

    @property
    def full(self) -> bool:
        return len(self._hits) >= self.limit

    def miss(self, item_id: int) -> None:
        self.searched += 1
        self.oldest = item_id

    def hit(self, item_id: int, hit: dict[str, Any]) -> None:
        self.miss(item_id)
        self._hits.append(hit)

    def timeout(self, item_id: int) -> None:
        self.miss(item_id)
        self._timed_out += 1
        if len(self._timed_out_ids) < TIMED_OUT_IDS_KEPT:
            self._timed_out_ids.append(item_id)

    def result(self, *, stopped_early: bool = False) -> SearchResult:
        return SearchResult(hits=list(self._hits), searched=self.searched, timed_out=self._timed_out,
                            timed_out_ids=list(self._timed_out_ids), stopped_early=stopped_early,
                            oldest_searched=self.oldest)


def scan(items: Iterable[StoredItem], pattern: regex.Pattern[str], limit: int, *, deadline: float,
         stop: threading.Event, where: Callable[[StoredItem], bool] | None = None,
         clock: Callable[[], float] = time.monotonic) -> SearchResult:
    """Test `items` (newest first) until `limit` hits, their end, the `deadline` (on `clock`), or `stop`.

    Runs in the worker thread. `stop` set: the caller was cancelled, and
    what this returns is dropped. `items` raising SearchInterrupted (its
    statement stopped at the deadline) ends the scan as stopped early.
    """
    window = NewestHits(limit)
    try:
        return _scan(window, items, pattern, deadline=deadline, stop=stop, where=where, clock=clock)
    except SearchInterrupted:
        return window.result(stopped_early=True)


def _scan(window: NewestHits, items: Iterable[StoredItem], pattern: regex.Pattern[str], *, deadline: float,
          stop: threading.Event, where: Callable[[StoredItem], bool] | None,
          clock: Callable[[], float]) -> SearchResult:
    for item in items:
        if window.full or stop.is_set():
            break
        remaining = deadline - clock()
        if remaining <= 0:
            return window.result(stopped_early=True)
        if where is not None and not where(item):
            continue
        text = body_text(item.content, item.meta.source_header)
        try:
            match = pattern.search(text, timeout=min(REGEX_TIMEOUT_S, remaining))
        except TimeoutError:
            if clock() >= deadline:  # the search's time ran out, not this item's: it was not tested
                return window.result(stopped_early=True)
            window.timeout(item.id)
            continue
        except MemoryError:  # `regex` gave up at its own memory cap (a fuzzy group repeated): untested, like a timeout
            window.timeout(item.id)
            continue
        if match is None:
            window.miss(item.id)
            continue
        window.hit(item.id, {
            "id": item.id, "serverId": item.meta.server_id, "channelId": item.meta.channel_id,
            "participant": item.participant, "createdAt": item.created_at,
            "snippet": _snippet(text, match.start(), match.end()),
        })
        if window.full:  # before asking `items` for one more (it may read a whole page for it)
            break
    return window.result()


async def search_items(store: Store, query: str, *, as_regex: bool = False, ignore_case: bool = False,
                       limit: int = 50, where: SearchFilter | None = None,
                       deadline_s: float = SEARCH_DEADLINE_S) -> SearchResult:
    """The newest `limit` items whose body matches, newest first, each with a body snippet, within `deadline_s`.

    `^` anchors at the body's start: the header is not part of what is searched.
    `where`: only the stored items it takes are searched (an agent's
    `history_search`: what it hears; `--channel`, `--since`).
    Raises SearchError for an unusable query.
    """
    if limit < 0:
        raise ValueError(f"limit must be at least 0, not {limit}")

    deadline = time.monotonic() + deadline_s  # waiting for a worker counts against it too

    def work(stop: threading.Event) -> SearchResult:
        pattern = compile_query(query, as_regex=as_regex, ignore_case=ignore_case)
        needs = required(query, as_regex=as_regex, ignore_case=ignore_case)
        reads = store.open_search_reads(lambda: stop.is_set() or time.monotonic() >= deadline)
        items = reads.newest_first(needs, where if where is not None else SearchFilter())
        try:
            return scan(items, pattern, limit, deadline=deadline, stop=stop)
        finally:
            items.close()
            reads.close()

    # One of the store's few scan slots (none to share when reads share the writer's connection, the old path).
    slots = store.scan_slots
    with anyio.move_on_after(deadline_s) as waiting:
        await slots.acquire()
    if waiting.cancelled_caught:  # no slot came free within the deadline: nothing was searched
        return SearchResult(hits=[], searched=0, timed_out=0, timed_out_ids=[], stopped_early=True)
    try:
        return await in_worker(work)
    finally:
        slots.release()


async def in_worker(work: Callable[[threading.Event], T]) -> T:
    """`work(stop)` in a worker thread, off the event loop; its exception is raised here.

    A cancelled caller sets `stop` and waits for `work` to return (it
    checks `stop` between rows), so no search outlives its caller.
    """
    stop = threading.Event()
    outcome: list[T] = []
    failure: list[BaseException] = []

    async def stop_when_cancelled() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            stop.set()

    async with anyio.create_task_group() as watching:
        watching.start_soon(stop_when_cancelled)
        try:
            # Not abandoned on cancellation: the wait ends when the worker does, which `stop` makes soon.
            outcome.append(await anyio.to_thread.run_sync(work, stop))
        except Exception as exc:  # raised below, outside the task group, not as an exception group
            failure.append(exc)
        finally:
            watching.cancel_scope.cancel()
    await anyio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller gets its cancellation, not a result
    if failure:
        raise failure[0]
    return outcome[0]


def timed_out_warning(result: SearchResult) -> str | None:
    """The one stderr line that says which items the expression could not be tested on, if any."""
    if not result.timed_out:
        return None
    ids = ", ".join(map(str, result.timed_out_ids)) + (", …" if result.timed_out > len(result.timed_out_ids) else "")
    return (f"warning: the regular expression ran out of time ({REGEX_TIMEOUT_S:g} s) on {result.timed_out} of"
            f" {result.searched} items, which are left out of the results (ids {ids})")


def stopped_early_warning(result: SearchResult, deadline_s: float) -> str | None:
    """The one stderr line that says the search ran out of time before it reached the oldest item, if it did."""
    if not result.stopped_early:
        return None
    where = ("no item was searched" if result.oldest_searched is None
             else f"items older than id {result.oldest_searched} were not searched")
    return f"warning: the search stopped after {deadline_s:g} s with {len(result.hits)} hits; {where}"


# --- the turns ledger ------------------------------------------------------------------


def turn_trigger(items: list[StoredItem]) -> str | None:
    """What started a turn, when its waking items say more than their ids: `peer from NAME[,NAME]` for peer rows.

    A peer wake holds peer rows only (the scheduler keeps them apart), so
    one peer row among the items names the trigger; NAME is the sender the
    host recorded in `metadata.peer.from` (docs/peers.md#seeing-it).
    """
    senders = dict.fromkeys(host.peer.sender for item in items if item.agent is not None
                            and isinstance(host := item.host, PeerMeta) and host.peer.sender is not None)
    return f"peer from {header_value(','.join(senders))}" if senders else None


async def turns_with_triggers(store: Store, *, agent: str | None,
                              limit: int | None) -> AsyncIterator[tuple[Turn, str | None]]:
    """Each turn (oldest first) with its `turn_trigger`, read from its waking items."""
    async for turn in store.turns.iterate(agent=agent, limit=limit):
        shown = turn.wake_item_ids[:WAKE_IDS_SHOWN]
        yield turn, turn_trigger(await store.items.get_many(shown)) if shown else None


def turn_plain_line(turn: Turn, trigger: str | None = None) -> str:
    """One turn for people: id, agent, outcome (or running), start (UTC), seconds, model, tokens, waking ids;
    and its trigger when there is one to name (`turn_trigger`)."""
    started = datetime.fromtimestamp(turn.started_at / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    took = "-" if turn.ended_at is None else f"{(turn.ended_at - turn.started_at) / 1000:.2f}s"
    tokens = "-" if turn.usage is None else str(spent_tokens(turn.usage))
    shown = ",".join(map(str, turn.wake_item_ids[:WAKE_IDS_SHOWN]))
    hidden = len(turn.wake_item_ids) - WAKE_IDS_SHOWN
    wake = (shown or "-") + (f",…+{hidden}" if hidden > 0 else "")
    return (f"{turn.id:>6}  {turn.agent:<16} {turn.outcome or 'running':<9} {started} {took:>8}"
            f"  {turn.model or '-'}  tokens={tokens}  wake={wake}" + (f"  trigger={trigger}" if trigger else ""))


# --- the outbox ------------------------------------------------------------------------


def _utc(ms: int | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def outbox_plain_line(row: OutboxRow) -> str:
    """One publish for people: id, agent, state, tries, queued (UTC), destination (quoted), messageId, last error."""
    where = f"{header_value(row.server_id)}/{header_value(row.channel_id)}"
    if row.thread_id is not None:
        where += f" thread {header_value(row.thread_id)}"
    error = "" if row.last_error is None else f"  error={header_value(row.last_error)}"
    return (f"{row.id:>6}  {row.agent:<16} {row.state:<9} tries={row.attempts:<2} {_utc(row.created_at)}"
            f"  {where}  message={header_value(row.message_id) if row.message_id is not None else '-'}{error}")
