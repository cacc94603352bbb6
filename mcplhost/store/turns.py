"""The turns ledger: one row per agent turn, what woke it, how it ended, what it cost.

`Turn` encodes (msgspec JSON) to exactly the line of `mcplhost turns --json`
(README.md#commands): id, agent, wakeItemIds, startedAt, endedAt, outcome, reason,
model, usage, requestDigest; fields a turn lacks are null, never left out.

A turn is written when it begins (`begin_many_nocommit`) and finished once
(`finish_many_nocommit`), so a host killed mid-turn leaves an open row that
`close_unfinished_nocommit` ends as aborted on the next start. A finished
turn keeps the hook injections its first request was compiled with
(docs/agents.md#turns), so its request digest can be reproduced. The ledger is
also the spend guard's memory: `usage_since`, `count_since` and
`started_since` read it, so a restart resets neither `max_tokens_per_day`
nor `max_turns_per_hour` (the runtime seeds each scheduler from
`started_since` at start).

Writes are validated when their value is built (`TurnStart`, `TurnEnd`), in
the caller's task: a bad value never reaches a group commit, where it would
fail the other writes sharing the transaction.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import msgspec

from mcplhost.store.connection import POSTGRESQL, Conn, Connections

#: One UTC day in milliseconds: the token budget's window, the daily charts, retention's days.
DAY_MS = 24 * 3600 * 1000
#: How a finished turn ended (docs/agents.md#turns); NULL in the table while it runs.
OUTCOMES = ("completed", "failed", "aborted", "held")
#: Every reason the host writes (docs/agents.md#turns); a failed turn's is REASON_BACKEND_ERROR or REASON_INTERNAL_ERROR.
REASON_STOPPED = "stopped"  # a stop command aborted it
REASON_SHUTDOWN = "shutdown"  # the host stopped while it ran
REASON_INTERRUPTED = "interrupted"  # the host was killed while it ran; closed at the next start
REASON_TOKEN_BUDGET = "token_budget"  # held: max_tokens_per_day is spent
REASON_BACKEND_ERROR = "backend_error"  # failed: the model backend failed (after its retries)
REASON_INTERNAL_ERROR = "internal_error"  # failed: a bug in the host (its traceback is logged)
#: Outcomes of turns that ran (a held wake ran no turn, so it does not count against max_turns_per_hour).
RAN_OUTCOMES = ("completed", "failed", "aborted")
#: A failed turn's cause is kept to this many characters (a backend's reason word, or an exception's type name).
CAUSE_MAX_CHARS = 100
#: Rows fetched per round trip when reading the ledger.
READ_PAGE_SIZE = 1000
#: Turns per INSERT statement (3 parameters each, far below SQLite's variable limit).
TURNS_PER_INSERT = 1024
#: Ids per `IN (...)` list (one parameter each).
IDS_PER_QUERY = 900
#: The usage keys as exported, from the backends' `Usage` field names.
USAGE_KEYS = {"input_tokens": "inputTokens", "output_tokens": "outputTokens", "cached_tokens": "cachedTokens"}
#: The usage keys whose sum is a turn's spend.
SPENT_KEYS = ("inputTokens", "outputTokens")

_DIGEST = re.compile(r"[0-9a-f]{64}")
_COLUMNS = "id, agent, wake_item_ids, started_at, ended_at, outcome, reason, model, usage, request_digest"
_encoder = msgspec.json.Encoder()
_ids_decoder = msgspec.json.Decoder(builtins.list[int])
_usage_decoder = msgspec.json.Decoder(dict[str, Any])


class Turn(msgspec.Struct, frozen=True, rename="camel"):
    """A turn as recorded; its JSON encoding is the `mcplhost turns --json` line.

    Field order is the export's key order, and no field has a default, so a
    missing value is written as null.
    """

    id: int
    agent: str
    wake_item_ids: builtins.list[int]
    started_at: int  # epoch ms
    ended_at: int | None  # None while the turn runs
    outcome: str | None  # one of OUTCOMES; None while the turn runs
    reason: str | None  # why it ended other than completed (REASON_*); None for a completed or running turn
    model: str | None
    usage: dict[str, Any] | None  # inputTokens, outputTokens, cachedTokens (and whatever else was recorded)
    request_digest: str | None  # 64 lowercase hex


def turn_line(turn: Turn) -> bytes:
    """The turn as one line of `mcplhost turns --json` (without the newline)."""
    return _encoder.encode(turn)


class TurnHealth(msgspec.Struct, frozen=True):
    """What `TurnRepository.health` reads for one agent."""

    last_error: str | None  # "reason: cause" of the newest failed turn no completed turn came after
    failed_since: int  # failed turns begun in the window asked about


class OutcomeCounts(msgspec.Struct, frozen=True):
    """What `TurnRepository.outcome_counts` reads: finished turns by (agent, outcome), settled and not."""

    through: int  # every turn with an id up to this one has ended
    settled: dict[tuple[str, str], int]  # turns above the id asked about, up to `through`
    unsettled: dict[tuple[str, str], int]  # finished turns above `through`


class TurnStart(msgspec.Struct, frozen=True):
    """A turn beginning: the ledger gives it its id."""

    agent: str
    wake_item_ids: tuple[int, ...]
    started_at: int  # epoch ms

    def __post_init__(self) -> None:
        if not self.agent:
            raise ValueError("a turn needs its agent's name")


class TurnEnd(msgspec.Struct, frozen=True):
    """How a turn ended; `usage` is normalised to the exported keys on construction."""

    turn_id: int
    ended_at: int  # epoch ms
    outcome: str
    model: str | None = None
    usage: dict[str, Any] | None = None
    request_digest: str | None = None
    injections: Any = None  # JSON-encodable; not part of the export line
    reason: str | None = None  # why it ended other than completed; None for a completed turn
    cause: str | None = None  # a failed turn's finer cause (e.g. "missing_key"); not part of the export line

    def __post_init__(self) -> None:
        check_outcome(self.outcome)
        if self.outcome == "completed" and self.reason is not None:
            raise ValueError(f"a completed turn has no reason, not {self.reason!r}")
        if self.cause is not None:
            msgspec.structs.force_setattr(self, "cause", self.cause[:CAUSE_MAX_CHARS])
        check_digest(self.request_digest)
        msgspec.structs.force_setattr(self, "usage", usage_record(self.usage))
        _json_or_none(self.injections)  # refused now if it cannot be stored

    @property
    def tokens(self) -> int:
        """What the turn spent: inputTokens + outputTokens."""
        return spent_tokens(self.usage)


def check_outcome(outcome: str) -> None:
    if outcome not in OUTCOMES:
        raise ValueError(f"a turn's outcome is one of {', '.join(OUTCOMES)}, not {outcome!r}")


def check_digest(digest: str | None) -> None:
    if digest is not None and not _DIGEST.fullmatch(digest):
        raise ValueError(f"a request digest is 64 lowercase hex characters, not {digest!r}")


def usage_record(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`usage` with the backends' snake_case token keys renamed to the export's camelCase; counts checked.

    Accepts `msgspec.structs.asdict(model.Usage)` or an already camelCase dict.
    """
    if usage is None:
        return None
    record = {USAGE_KEYS.get(key, key): value for key, value in usage.items()}
    for key in USAGE_KEYS.values():
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"usage {key} must be a whole number of tokens from 0, not {value!r}")
    return record


def spent_tokens(usage: Mapping[str, Any] | None) -> int:
    """inputTokens + outputTokens of a normalised usage record (0 when absent)."""
    return sum(usage.get(key) or 0 for key in SPENT_KEYS) if usage else 0


class TurnRepository:
    """Record turns and read the ledger; the only code that knows the turns table."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def begin_many_nocommit(self, starts: Sequence[TurnStart]) -> builtins.list[int]:
        """Record each turn as running, inside the caller's transaction; their new ids, in order."""
        conn = self._connections.writer("turns.begin_many_nocommit")
        ids: builtins.list[int] = []
        for first in range(0, len(starts), TURNS_PER_INSERT):
            chunk = starts[first : first + TURNS_PER_INSERT]
            returned = await conn.fetch(
                "INSERT INTO turns (agent, wake_item_ids, started_at) VALUES "
                + ", ".join(["(?, ?, ?)"] * len(chunk)) + " RETURNING id",
                [v for s in chunk for v in (s.agent, _encoder.encode(list(s.wake_item_ids)).decode(), s.started_at)],
            )
            # RETURNING's order is unspecified; ids rise in the order the VALUES rows are inserted.
            ids.extend(sorted(row[0] for row in returned))
        return ids

    async def finish_many_nocommit(self, ends: Sequence[TurnEnd]) -> builtins.list[bool]:
        """End each running turn, inside the caller's transaction; per end, whether it ended a running turn.

        An unknown or already finished turn is left as it is (False), so a
        caller's mistake never fails the other writes of its group.
        """
        conn = self._connections.writer("turns.finish_many_nocommit")
        running = await _running(conn, {end.turn_id for end in ends})
        done: builtins.list[bool] = []
        winners: builtins.list[TurnEnd] = []
        for end in ends:
            done.append(end.turn_id in running)
            if end.turn_id in running:
                running.discard(end.turn_id)
                winners.append(end)
        if winners:
            await conn.executemany(
                "UPDATE turns SET ended_at = ?, outcome = ?, reason = ?, model = ?, usage = ?, request_digest = ?,"
                " tokens = ?, injections = ?, cause = ? WHERE id = ?",
                [(e.ended_at, e.outcome, e.reason, e.model, _json_or_none(e.usage), e.request_digest, e.tokens,
                  _json_or_none(e.injections), e.cause, e.turn_id) for e in winners],
            )
        return done

    async def close_unfinished_nocommit(self, ended_at: int, outcome: str = "aborted", *,
                                        agents: Sequence[str] | None = None) -> int:
        """End every turn still running (left open by a host that was killed) with REASON_INTERRUPTED; how many.

        `agents`: only theirs (None: every agent's)."""
        conn = self._connections.writer("turns.close_unfinished_nocommit")
        check_outcome(outcome)
        only = "" if agents is None else f" AND agent IN ({', '.join('?' * len(agents)) or 'NULL'})"
        return await conn.execute(
            "UPDATE turns SET ended_at = CASE WHEN started_at > ? THEN started_at ELSE ? END, outcome = ?, reason = ?"
            f" WHERE ended_at IS NULL{only}", (ended_at, ended_at, outcome, REASON_INTERRUPTED, *(agents or ())))

    async def get(self, turn_id: int) -> Turn | None:
        """One turn by id, or None."""
        async with self._connections.read() as conn:
            rows = await conn.fetch(f"SELECT {_COLUMNS} FROM turns WHERE id = ?", (turn_id,))
        return next((_turn(row) for row in rows), None)

    async def waking(self, item_id: int) -> builtins.list[Turn]:
        """The turns whose wake_item_ids hold `item_id` (for `mcplhost explain`), oldest first.

        A scan of the ledger through the JSON arrays: fine for the CLI, never on the inbound path.
        """
        async with self._connections.read() as conn:
            if conn.engine == POSTGRESQL:
                members = ("SELECT 1 FROM json_array_elements_text(turns.wake_item_ids) AS member"
                           " WHERE member = CAST(CAST(? AS BIGINT) AS TEXT)")
            else:
                members = "SELECT 1 FROM json_each(turns.wake_item_ids) WHERE json_each.value = ?"
            rows = await conn.fetch(f"SELECT {_COLUMNS} FROM turns WHERE EXISTS ({members}) ORDER BY id", (item_id,))
        return [_turn(row) for row in rows]

    async def injections(self, turn_id: int) -> Any:
        """The hook injections recorded with the turn (decoded JSON), or None."""
        async with self._connections.read() as conn:
            rows = await conn.fetch("SELECT injections FROM turns WHERE id = ?", (turn_id,))
        value = next((row[0] for row in rows), None)
        return None if value is None else msgspec.json.decode(value)

    async def list(self, *, agent: str | None = None, limit: int | None = None) -> builtins.list[Turn]:
        """Turns oldest first (by id); with `limit`, only the newest `limit` of them (still oldest first)."""
        return [turn async for turn in self.iterate(agent=agent, limit=limit)]

    async def iterate(self, *, agent: str | None = None, limit: int | None = None) -> AsyncIterator[Turn]:
        """What `list` returns, fetched a page at a time; turns begun after the iteration starts are left out."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be at least 0, not {limit}")
        if limit == 0:
            return
        where, params = ("agent = ?", (agent,)) if agent is not None else ("TRUE", ())
        async with self._connections.read() as conn:
            ((last,),) = await conn.fetch("SELECT coalesce(max(id), 0) FROM turns")
            after = 0
            if limit is not None:
                rows = await conn.fetch(
                    f"SELECT id FROM turns WHERE {where} ORDER BY id DESC LIMIT 1 OFFSET ?", (*params, limit))
                after = next((row[0] for row in rows), 0)
        while True:
            async with self._connections.read() as conn:
                rows = builtins.list(await conn.fetch(
                    f"SELECT {_COLUMNS} FROM turns WHERE {where} AND id > ? AND id <= ? ORDER BY id LIMIT ?",
                    (*params, after, last, READ_PAGE_SIZE)))
            for row in rows:
                yield _turn(row)
            if len(rows) < READ_PAGE_SIZE:
                return
            after = rows[-1][0]

    async def usage_since(self, agent: str, since_ms: int) -> int:
        """Tokens (input + output) the agent's turns begun at or after `since_ms` spent (max_tokens_per_day)."""
        return await self._scalar("SELECT CAST(coalesce(sum(tokens), 0) AS BIGINT) FROM turns"
                                  " WHERE agent = ? AND started_at >= ?",
                                  (agent, since_ms))

    async def count_since(self, agent: str, since_ms: int) -> int:
        """Turns of the agent begun at or after `since_ms` that ran: running ones count, held wakes do not."""
        return await self._scalar(
            "SELECT count(*) FROM turns WHERE agent = ? AND started_at >= ? AND (outcome IS NULL OR outcome IN"
            f" ({', '.join('?' * len(RAN_OUTCOMES))}))", (agent, since_ms, *RAN_OUTCOMES))

    async def started_since(self, agent: str, since_ms: int, *, limit: int | None = None) -> builtins.list[int]:
        """Start times (epoch ms, oldest first) of the agent's turns that ran, begun at or after `since_ms`.

        The turns `count_since` counts, so a restarted scheduler can age each
        out of max_turns_per_hour's window when it leaves; with `limit`, only
        the newest `limit` (the guard needs no more than its cap).
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be at least 0, not {limit}")
        sql = ("SELECT started_at FROM turns WHERE agent = ? AND started_at >= ? AND (outcome IS NULL OR outcome IN"
               f" ({', '.join('?' * len(RAN_OUTCOMES))})) ORDER BY started_at DESC, id DESC")
        params: tuple[Any, ...] = (agent, since_ms, *RAN_OUTCOMES)
        if limit is not None:
            sql, params = sql + " LIMIT ?", (*params, limit)
        async with self._connections.read() as conn:
            rows = await conn.fetch(sql, params)
        return [row[0] for row in reversed(builtins.list(rows))]

    async def health(self, agent: str, since_ms: int) -> TurnHealth:
        """The agent's `lastError` and failed turns begun at or after `since_ms` (docs/operations.md#the-status-fields).

        `last_error`: the newest turn that ended `completed` or `failed`, when
        it failed, as "reason: cause" (or its reason alone); None once a later
        turn completed (aborted and held turns neither set nor clear it). Read
        through turns_by_agent, newest first, stopping at the first such turn.
        """
        async with self._connections.read() as conn:
            newest = await conn.fetch(
                "SELECT outcome, reason, cause FROM turns WHERE agent = ? AND outcome IN ('completed', 'failed')"
                " ORDER BY started_at DESC, id DESC LIMIT 1", (agent,))
            ((failed,),) = await conn.fetch(
                "SELECT count(*) FROM turns WHERE agent = ? AND started_at >= ? AND outcome = 'failed'",
                (agent, since_ms))
        last_error = None
        for outcome, reason, cause in newest:
            if outcome == "failed":
                last_error = ": ".join(part for part in (reason or "failed", cause) if part)
        return TurnHealth(last_error=last_error, failed_since=int(failed))

    async def outcome_counts(self, after_id: int) -> OutcomeCounts:
        """Finished turns by (agent, outcome) above `after_id`, split where the oldest running turn begins.

        `settled`: the counts of the turns up to `through` (every one of them
        finished, so they never change again); `unsettled`: those of finished
        turns above it (a running turn below them may still end). A caller
        keeps `settled` and asks again after `through` (metrics/turns.py).
        """
        async with self._connections.read() as conn:
            ((running, last),) = await conn.fetch(
                "SELECT (SELECT min(id) FROM turns WHERE id > ? AND ended_at IS NULL),"
                " (SELECT coalesce(max(id), ?) FROM turns)", (after_id, after_id))
            through = max(after_id, (running - 1) if running is not None else last)
            settled = await conn.fetch(
                "SELECT agent, outcome, count(*) FROM turns WHERE id > ? AND id <= ? AND outcome IS NOT NULL"
                " GROUP BY agent, outcome", (after_id, through))
            unsettled = await conn.fetch(
                "SELECT agent, outcome, count(*) FROM turns WHERE id > ? AND outcome IS NOT NULL"
                " GROUP BY agent, outcome", (through,))
        return OutcomeCounts(through=through, settled={(a, o): n for a, o, n in settled},
                             unsettled={(a, o): n for a, o, n in unsettled})

    async def daily(self, agent: str, since_ms: int) -> builtins.list[tuple[int, int, int]]:
        """(day start, turns that ran, tokens) for each UTC day with a turn of the agent begun at or after `since_ms`,
        oldest first (the console's week chart; a held wake is no turn but its tokens, none, count)."""
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                f"SELECT started_at - started_at % {DAY_MS} AS day, CAST(sum(CASE WHEN outcome IS NULL OR outcome IN"
                f" ({', '.join('?' * len(RAN_OUTCOMES))}) THEN 1 ELSE 0 END) AS BIGINT),"
                " CAST(coalesce(sum(tokens), 0) AS BIGINT) FROM turns"
                " WHERE agent = ? AND started_at >= ? GROUP BY day ORDER BY day",
                (*RAN_OUTCOMES, agent, since_ms))
        return [(day, ran, tokens) for day, ran, tokens in rows]

    async def _scalar(self, sql: str, params: tuple[Any, ...]) -> int:
        async with self._connections.read() as conn:
            ((value,),) = await conn.fetch(sql, params)
        return int(value)


async def _running(conn: Conn, turn_ids: set[int]) -> set[int]:
    """Those of `turn_ids` that are still running."""
    found: set[int] = set()
    ordered = sorted(turn_ids)
    for first in range(0, len(ordered), IDS_PER_QUERY):
        chunk = ordered[first : first + IDS_PER_QUERY]
        rows = await conn.fetch(
            f"SELECT id FROM turns WHERE ended_at IS NULL AND id IN ({', '.join('?' * len(chunk))})", chunk)
        found.update(row[0] for row in rows)
    return found


def _json_or_none(value: Any) -> str | None:
    return None if value is None else _encoder.encode(value).decode()


def _turn(row: Sequence[Any]) -> Turn:
    turn_id, agent, wake_item_ids, started_at, ended_at, outcome, reason, model, usage, request_digest = row
    return Turn(
        id=turn_id,
        agent=agent,
        wake_item_ids=_ids_decoder.decode(wake_item_ids),
        started_at=started_at,
        ended_at=ended_at,
        outcome=outcome,
        reason=reason,
        model=model,
        usage=None if usage is None else _usage_decoder.decode(usage),
        request_digest=request_digest,
    )
