"""Readers of what was said: they read bodies only, never the source header (PROVENANCE §6).
Also the plain views of the turns ledger (`mcplhost turns`) and the outbox (`mcplhost outbox`).

`search_items` streams the table a page at a time (`items.iterate`), so its
memory is one page plus the hits it keeps, whatever the table's size. Hits
are the newest `limit` matches: the scan runs oldest first (the only order
the store pages in) and keeps a window of the latest hits. A regular
expression that runs out of time on an item is not a silent miss: the item
is counted in `SearchResult.timed_out`, for the caller to report, if it
could have been among the hits (newer than the oldest hit of a full window).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
import regex

from .inbound.notice import reader_body
from .inbound.quoting import header_value
from .store import Store
from .store.outbox import OutboxRow
from .store.turns import Turn, spent_tokens

#: A user's regular expression gets this long per item before it is abandoned.
REGEX_TIMEOUT_S = 0.5
#: Characters of context on each side of a hit in a snippet.
SNIPPET_CONTEXT = 40
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
    timed_out: int  # items whose test ran out of time and that could have been hits: they are not in `hits`
    timed_out_ids: list[int]  # the newest of those (at most TIMED_OUT_IDS_KEPT), newest first


def body_text(content: list[dict[str, Any]], metadata: dict[str, Any]) -> str:
    """The body's text blocks joined with nothing between, header dropped."""
    return "".join(b["text"] for b in reader_body(content, metadata) if b.get("type") == "text")


def _snippet(text: str, start: int, end: int) -> str:
    left = max(0, start - SNIPPET_CONTEXT)
    right = min(len(text), end + SNIPPET_CONTEXT)
    piece = text[left:right].replace("\n", " ")
    return ("…" if left else "") + piece + ("…" if right < len(text) else "")


def compile_query(query: str, *, as_regex: bool, ignore_case: bool) -> regex.Pattern[str]:
    """The query as a pattern (a literal unless `as_regex`); SearchError if it is not a valid expression."""
    flags = regex.IGNORECASE | regex.FULLCASE if ignore_case else 0
    try:
        return regex.compile(query if as_regex else regex.escape(query), flags)
    except regex.error as exc:
        raise SearchError(f"invalid regular expression: {exc}") from None


class NewestHits:
    """The newest `limit` hits of a scan that runs oldest first, and the timeouts that could have been hits.

    Pure bookkeeping, fed in id order: `hit(id, hit)`, `timeout(id)`, then `result()`.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._hits: deque[dict[str, Any]] = deque(maxlen=limit)
        # Beside each hit, the timeouts counted before it: once the window is full,
        # only timeouts after its oldest hit could have changed the results.
        self._timeouts_before: deque[int] = deque(maxlen=limit)
        self._timed_out_ids: deque[int] = deque(maxlen=TIMED_OUT_IDS_KEPT)
        self._timed_out = 0
        self.searched = 0

    def miss(self) -> None:
        self.searched += 1

    def hit(self, hit: dict[str, Any]) -> None:
        self.searched += 1
        self._timeouts_before.append(self._timed_out)
        self._hits.append(hit)

    def timeout(self, item_id: int) -> None:
        self.searched += 1
        self._timed_out += 1
        self._timed_out_ids.append(item_id)

    def result(self) -> SearchResult:
        hits, timed_out = self._hits, self._timed_out
        if len(hits) < self.limit:  # the window is not full: every timed-out item could have been a hit
            ids = list(reversed(self._timed_out_ids))
        elif hits:  # full: only items newer than its oldest hit could have been hits
            timed_out -= self._timeouts_before[0]
            ids = [i for i in reversed(self._timed_out_ids) if i > hits[0]["id"]]
        else:  # limit 0: nothing could have been a hit
            timed_out, ids = 0, []
        return SearchResult(hits=list(reversed(hits)), searched=self.searched, timed_out=timed_out,
                            timed_out_ids=ids)


async def search_items(store: Store, query: str, *, as_regex: bool = False, ignore_case: bool = False,
                       limit: int = 50, where: Callable[[Any], bool] | None = None) -> SearchResult:
    """The newest `limit` items whose body matches, newest first, each with a body snippet.

    `^` anchors at the body's start: the header is not part of what is searched.
    `where`: only the stored items it accepts are searched (an agent's `history_search`: what it hears).
    """
    pattern = compile_query(query, as_regex=as_regex, ignore_case=ignore_case)
    window = NewestHits(limit)
    async for item in store.items.iterate():
        if where is not None and not where(item):
            continue
        text = body_text(item.content, item.metadata)
        try:
            match = pattern.search(text, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            window.timeout(item.id)
            continue
        if match is None:
            window.miss()
            continue
        window.hit({
            "id": item.id, "serverId": item.metadata.get("serverId"), "channelId": item.metadata.get("channelId"),
            "participant": item.participant, "createdAt": item.created_at,
            "snippet": _snippet(text, match.start(), match.end()),
        })
    return window.result()


def timed_out_warning(result: SearchResult) -> str | None:
    """The one stderr line that says which items the expression could not be tested on, if any."""
    if not result.timed_out:
        return None
    ids = ", ".join(map(str, result.timed_out_ids)) + (", …" if result.timed_out > len(result.timed_out_ids) else "")
    return (f"warning: the regular expression ran out of time ({REGEX_TIMEOUT_S:g} s) on {result.timed_out} of"
            f" {result.searched} items, which are left out of the results (ids {ids})")


# --- the turns ledger ------------------------------------------------------------------


def turn_plain_line(turn: Turn) -> str:
    """One turn for people: id, agent, outcome (or running), start (UTC), seconds, model, tokens, waking ids."""
    started = datetime.fromtimestamp(turn.started_at / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    took = "-" if turn.ended_at is None else f"{(turn.ended_at - turn.started_at) / 1000:.2f}s"
    tokens = "-" if turn.usage is None else str(spent_tokens(turn.usage))
    shown = ",".join(map(str, turn.wake_item_ids[:WAKE_IDS_SHOWN]))
    hidden = len(turn.wake_item_ids) - WAKE_IDS_SHOWN
    wake = (shown or "-") + (f",…+{hidden}" if hidden > 0 else "")
    return (f"{turn.id:>6}  {turn.agent:<16} {turn.outcome or 'running':<9} {started} {took:>8}"
            f"  {turn.model or '-'}  tokens={tokens}  wake={wake}")


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
