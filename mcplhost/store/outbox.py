"""The publish outbox: one row per publish, and what became of it (docs/connectors.md §13).

A row is written pending, in the same transaction as the speech row that
caused it (operations.PublishSpeech), before anything is sent. The sender of
its connector (speech/outbox.py) reads the pending rows in id order, and
ends each once: `delivered` with the connector's messageId, or `failed` with
the reason. Between tries a row records its attempts and when it may be
tried again, so a restarted host resumes where the last one stopped.

`OutboxRow` encodes (msgspec JSON) to exactly the line of `mcplhost outbox
--json` (docs/operations.md); the fields a row lacks are null.

Echo suppression asks `recent_delivered(server, channel, messageId)`: a
bounded in-memory window of recent deliveries, fed by the sender after each
commit and seeded from the table at start (`load_recent_delivered`: the
deliveries of the last ECHO_WINDOW_MS), so it also holds after a restart.

Hosts sharing a PostgreSQL store (docs/operations.md#several-hosts-on-one-store):
a row is sent by the host that owns its connector, whichever host's agent
wrote it. The transaction that queues rows also says so on the PUBLISH_CHANNEL
notification channel, once per connector, with the connector's name as the
payload; PostgreSQL delivers it at commit, to every host listening. SQLite
has one daemon and no notification: its turn wakes its own sender.
"""

from __future__ import annotations

import builtins
import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence

import msgspec

from mcplhost.store.connection import Connections, notify_at_commit

#: A row's states, as exported.
STATES = ("pending", "delivered", "failed")
#: Recent deliveries remembered in memory for the echo lookup.
RECENT_DELIVERED = 4096
#: How far back the echo window is seeded from the table at start (older deliveries are not loaded).
ECHO_WINDOW_MS = 24 * 3600 * 1000
#: Recent delivered texts remembered (as digests) with the agent that spoke them, for the loop breaker
#: (mcplhost/peers/loops.py): another agent's speech coming back through a chat connector.
RECENT_SPOKEN = 4096
#: The newest rows `newest` looks through for a state other than pending.
RECENT_WINDOW_ROWS = 10_000
#: Rows fetched per round trip when reading.
READ_PAGE_SIZE = 1000
#: Longest error text kept with a row.
LAST_ERROR_MAX_CHARS = 500
#: The PostgreSQL notification channel on which a commit that queued rows names their connector.
PUBLISH_CHANNEL = "mcplhost_outbox"

_encoder = msgspec.json.Encoder()
_COLUMNS = ("id, agent, turn_id, server_id, channel_id, thread_id, state, attempts, message_id, last_error,"
            " created_at, delivered_at")
_PENDING_COLUMNS = ("id, agent, turn_id, server_id, channel_id, thread_id, conversation_id, text, attempts,"
                    " created_at, first_attempt_at, next_attempt_at")


class OutboxEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A publish about to be queued; the store gives it its id."""

    agent: str
    turn_id: int | None
    server_id: str
    channel_id: str
    thread_id: str | None
    conversation_id: str  # ingest.conversation_id(server_id, channel_id, thread_id)
    text: str
    created_at: int  # epoch ms

    def __post_init__(self) -> None:
        for name in ("agent", "server_id", "channel_id", "conversation_id"):
            if not getattr(self, name):
                raise ValueError(f"an outbox entry needs its {name}")


class OutboxRow(msgspec.Struct, frozen=True, rename="camel"):
    """A publish as recorded; its JSON encoding is the `mcplhost outbox --json` line (key order included)."""

    id: int
    agent: str
    turn_id: int | None
    server_id: str
    channel_id: str
    thread_id: str | None
    state: str
    attempts: int
    message_id: str | None
    last_error: str | None
    created_at: int
    delivered_at: int | None


def outbox_line(row: OutboxRow) -> bytes:
    """The row as one line of `mcplhost outbox --json` (without the newline)."""
    return _encoder.encode(row)


class PendingPublish(msgspec.Struct, frozen=True):
    """What a sender needs of a pending row."""

    id: int
    agent: str
    turn_id: int | None
    server_id: str
    channel_id: str
    thread_id: str | None
    conversation_id: str
    text: str
    attempts: int
    created_at: int
    first_attempt_at: int | None
    next_attempt_at: int


class OutboxRepository:
    """Queue publishes and record their fate; the only code that knows the outbox table."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections
        self._recent: OrderedDict[tuple[str, str, str], int] = OrderedDict()
        self._spoken: OrderedDict[str, str] = OrderedDict()  # speech_key(text) → the agent that said it

    async def insert_many_nocommit(self, entries: Sequence[OutboxEntry]) -> builtins.list[int]:
        """Queue each entry as pending, inside the caller's transaction; their new ids, in order."""
        conn, ids = self._connections.writer("outbox.insert_many_nocommit"), []
        for e in entries:  # RETURNING per row: ids come from the database, in order
            rows = await conn.fetch(
                "INSERT INTO outbox (agent, turn_id, server_id, channel_id, thread_id, conversation_id, text,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (e.agent, e.turn_id, e.server_id, e.channel_id, e.thread_id, e.conversation_id, e.text,
                 e.created_at))
            ids.append(next(iter(rows))[0])
        # Delivered at commit: the connector's owner looks at its queue then.
        await notify_at_commit(conn, PUBLISH_CHANNEL, (e.server_id for e in entries))
        return ids

    async def attempt_many_nocommit(self, attempts: Sequence[tuple[int, int, int, str]]) -> None:
        """Record a failed try of pending rows: (id, at, next_attempt_at, error); attempts counts up."""
        conn = self._connections.writer("outbox.attempt_many_nocommit")
        if attempts:
            await conn.executemany(
                "UPDATE outbox SET attempts = attempts + 1, first_attempt_at = coalesce(first_attempt_at, ?),"
                " next_attempt_at = ?, last_error = ? WHERE id = ? AND state = 'pending'",
                [(at, next_at, error[:LAST_ERROR_MAX_CHARS], row_id) for row_id, at, next_at, error in attempts])

    async def end_many_nocommit(self, ends: Sequence[tuple[int, str, int, str | None, str | None, bool]],
                                ) -> builtins.list[bool]:
        """End pending rows: (id, state, at, message_id, error, attempted); True for each row that was pending."""
        conn = self._connections.writer("outbox.end_many_nocommit")
        results = []
        for row_id, state, at, message_id, error, attempted in ends:
            if state not in ("delivered", "failed"):
                raise ValueError(f"an outbox row ends delivered or failed, not {state!r}")
            changed = await conn.execute(
                "UPDATE outbox SET state = ?, delivered_at = ?, message_id = ?,"
                " last_error = coalesce(?, last_error), attempts = attempts + ?,"
                " first_attempt_at = coalesce(first_attempt_at, ?) WHERE id = ? AND state = 'pending'",
                (state, at, message_id, error[:LAST_ERROR_MAX_CHARS] if error else None, int(attempted),
                 at if attempted else None, row_id))
            results.append(changed == 1)
        return results

    async def fail_turn_pending_nocommit(self, turn_id: int, at: int, reason: str) -> builtins.list[int]:
        """Fail every still pending row of one turn, unsent, with `reason` as its error; the ids failed.

        One conditional UPDATE: a row a sender ended meanwhile keeps its end,
        and a sender that picked a row up before this commit sees it no longer
        pending when it looks again just before sending (speech/outbox.py).
        """
        conn = self._connections.writer("outbox.fail_turn_pending_nocommit")
        rows = await conn.fetch(
            "UPDATE outbox SET state = 'failed', delivered_at = ?, last_error = ?"
            " WHERE turn_id = ? AND state = 'pending' RETURNING id", (at, reason[:LAST_ERROR_MAX_CHARS], turn_id))
        return sorted(row[0] for row in rows)

    async def is_pending(self, outbox_id: int) -> bool:
        """Whether the row is still pending (the sender asks just before each try)."""
        async with self._connections.read() as conn:
            rows = await conn.fetch("SELECT 1 FROM outbox WHERE id = ? AND state = 'pending'",
                                               (outbox_id,))
        return bool(rows)

    async def pending(self, server_id: str, *, limit: int, per_channel: int | None = None,
                      ) -> builtins.list[PendingPublish]:
        """The connector's pending rows, each channel's in id order (at most `limit`).

        Without `per_channel`: the oldest first. With it: at most that many of
        each channel, every channel's oldest row first, then every channel's
        second, and so on, so one channel's long queue (a channel in backoff)
        cannot crowd the others out of the page.
        """
        if per_channel is None:
            query = (f"SELECT {_PENDING_COLUMNS} FROM outbox WHERE server_id = ? AND state = 'pending'"
                     " ORDER BY id LIMIT ?")
            arguments: tuple[object, ...] = (server_id, limit)
        else:
            query = (f"SELECT {_PENDING_COLUMNS} FROM (SELECT {_PENDING_COLUMNS}, row_number() OVER"
                     " (PARTITION BY channel_id ORDER BY id) AS place FROM outbox"
                     " WHERE server_id = ? AND state = 'pending') AS placed WHERE place <= ? ORDER BY place, id LIMIT ?")
            arguments = (server_id, per_channel, limit)
        async with self._connections.read() as conn:
            rows = await conn.fetch(query, arguments)
        return [PendingPublish(*row) for row in rows]

    async def pending_connectors(self) -> builtins.list[str]:
        """The connectors that have pending rows, by name (the partial index of pending rows answers it)."""
        async with self._connections.read() as conn:
            rows = await conn.fetch("SELECT DISTINCT server_id FROM outbox WHERE state = 'pending' ORDER BY server_id")
        return [row[0] for row in rows]

    async def get(self, outbox_id: int) -> OutboxRow | None:
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM outbox WHERE id = ?", (outbox_id,))
        return next((OutboxRow(*row) for row in rows), None)

    async def of_turn(self, turn_id: int) -> builtins.list[OutboxRow]:
        """The publishes a turn queued, by id (for `mcplhost explain`)."""
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM outbox WHERE turn_id = ? ORDER BY id", (turn_id,))
        return [OutboxRow(*row) for row in rows]

    async def delivered_as(self, server_id: str, channel_id: str, message_id: str) -> int | None:
        """The outbox id of the delivered publish the platform gave that messageId, or None (the whole ledger)."""
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                "SELECT id FROM outbox WHERE state = 'delivered' AND server_id = ? AND channel_id = ?"
                " AND message_id = ? ORDER BY id LIMIT 1", (server_id, channel_id, message_id))
        return next((row[0] for row in rows), None)

    async def count(self, state: str = "pending") -> int:
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                "SELECT count(*) FROM outbox WHERE state = ?", (state,))
        return int(next(iter(rows))[0])

    async def pending_by_agent(self) -> dict[str, int]:
        """Each agent's pending publishes (agents with none left out)."""
        async with self._connections.read() as conn:
            rows = await conn.fetch("SELECT agent, count(*) FROM outbox WHERE state = 'pending' GROUP BY agent")
        return {agent: pending for agent, pending in rows}

    async def iterate(self, *, state: str | None = None) -> AsyncIterator[OutboxRow]:
        """Every row (or those in `state`), oldest first, a page at a time."""
        after = 0
        where, chosen = ("id > ? AND state = ?", (state,)) if state is not None else ("id > ?", ())
        while True:
            async with self._connections.read() as conn:
                rows = list(await conn.fetch(f"SELECT {_COLUMNS} FROM outbox WHERE {where} ORDER BY id LIMIT ?",
                                             (after, *chosen, READ_PAGE_SIZE)))
            for row in rows:
                yield OutboxRow(*row)
            if len(rows) < READ_PAGE_SIZE:
                return
            after = rows[-1][0]

    async def newest(self, state: str, limit: int, *, agent: str | None = None,
                     window: int = RECENT_WINDOW_ROWS) -> builtins.list[OutboxRow]:
        """Up to `limit` rows in `state`, newest first: every pending one (its index finds them), other states
        among the newest `window` rows (the console's outbox page)."""
        where, params = ("state = ?", [state]) if state == "pending" else (
            "id > (SELECT coalesce(max(id), 0) FROM outbox) - ? AND state = ?", [window, state])
        if agent is not None:
            where += " AND agent = ?"
            params.append(agent)
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM outbox WHERE {where} ORDER BY id DESC LIMIT ?", (*params, limit))
        return [OutboxRow(*row) for row in rows]

    async def list(self, *, state: str | None = None) -> builtins.list[OutboxRow]:
        return [row async for row in self.iterate(state=state)]

    def remember_delivered(self, server_id: str, channel_id: str, message_id: str | None, outbox_id: int, *,
                           agent: str | None = None, text: str | None = None) -> None:
        """Feed the in-memory windows (the sender calls this once the delivery is committed).

        `message_id` feeds the echo window; `agent` and `text` the window of recent speech.
        """
        if message_id is not None:
            key = (server_id, channel_id, message_id)
            self._recent[key] = outbox_id
            self._recent.move_to_end(key)
            while len(self._recent) > RECENT_DELIVERED:
                self._recent.popitem(last=False)
        if agent is not None and text is not None:
            spoken = speech_key(text)
            self._spoken[spoken] = agent
            self._spoken.move_to_end(spoken)
            while len(self._spoken) > RECENT_SPOKEN:
                self._spoken.popitem(last=False)

    def recent_delivered(self, server_id: str, channel_id: str, message_id: str) -> int | None:
        """The in-memory answer only: the outbox id of a recent delivery with that messageId, or None."""
        return self._recent.get((server_id, channel_id, message_id))

    def recent_speaker(self, text: str) -> str | None:
        """The agent whose recently delivered publish had this text (whitespace aside), or None; memory only."""
        return self._spoken.get(speech_key(text))

    async def load_recent_delivered(self, now_ms: int) -> int:
        """Seed the in-memory windows from the table (after a restart); return how many deliveries the echo one holds.

        The last RECENT_DELIVERED deliveries of the ECHO_WINDOW_MS before `now_ms`, oldest first,
        so the windows are what they would have been had the host not stopped.
        """
        async with self._connections.read() as conn:
            rows = await conn.fetch(
                "SELECT server_id, channel_id, message_id, id, agent, text FROM outbox WHERE state = 'delivered'"
                " AND delivered_at >= ? ORDER BY delivered_at DESC, id DESC LIMIT ?",
                (now_ms - ECHO_WINDOW_MS, max(RECENT_DELIVERED, RECENT_SPOKEN)))
        for server_id, channel_id, message_id, outbox_id, agent, text in reversed(builtins.list(rows)):
            if message_id is not None and (server_id, channel_id, message_id) in self._recent:
                message_id = None  # the sender's own is as new
            if speech_key(text) in self._spoken:
                agent = None
            self.remember_delivered(server_id, channel_id, message_id, outbox_id, agent=agent, text=text)
        return len(self._recent)


def speech_key(text: str) -> str:
    """What two texts share when they are the same speech: a digest of the text with whitespace runs as one space."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8", "surrogatepass")).hexdigest()
