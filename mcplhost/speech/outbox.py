"""One sender per connector: delivers its pending outbox rows with `channels/publish` (docs/connectors.md §13).

The sender reads its connector's pending rows from the store (never from
memory alone), so a connector restart or a host restart resumes where it
stopped; delivery is at least once (a publish whose answer was lost is sent
again). It sends only while the connector is ready, one publish at a time,
and in order per channel: a channel's later rows wait while its oldest row
waits for a retry, and never hold back another channel's (behind a full
page of waiting rows, the sender reads at most PENDING_PER_CHANNEL rows of
each channel, every channel's oldest first). Before every try the sender asks whether the connector may publish
there now (speech/routing.py `publish_refusal`: it holds `channels.publish`,
the channel is registered and inside the operator's patterns, and not
inbound only); a row that may not ends failed with reason `not_permitted`.
Just before its try the row is read again: one a stop failed since the page
was read (store/outbox.py `fail_turn_pending_nocommit`) is never sent.
A channel not registered yet is waited for CHANNEL_GRACE_S after a life
becomes ready, since a restarted connector registers its channels again
only after its handshake. Each outcome is committed through the group writer:

- `{delivered: true, messageId}` ends the row delivered (the messageId feeds
  echo suppression: `store.outbox.remember_delivered`);
- a permanent error ends it failed at once; a retryable one (timeout, dead
  connection, -32603) records the try and waits its backoff (speech/retry.py);
- a publish whose line would pass the connector's line cap (`max_line_bytes`)
  is never written: it ends failed at once, reason `too_large` (trying again
  cannot make it fit);
- a row pending longer than its agent's `publish_max_age_s` fails unsent,
  also while the connector is down or stopped for good (checked every AGE_CHECK_S).

`run()` is an exception boundary: an unexpected exception (a store fault, a
bug) is logged once with its traceback and the sender starts over after a
backoff (SENDER_RESTART), from the rows in the store, so nothing is lost
(a crash between a publish and its commit sends it again: at least once);
the host and the other senders go on. A row whose try crashed the sender
CRASHES_PER_ROW times in a row ends failed, with its notice, so one bad row
cannot hold its connector's queue for good. Cancellation passes through.

A failed row stores a `failed-reply` notice for its agent (an agent row:
it wakes no one), built by the store's notice builder (store/own_rows.py),
the one the agents' notices are built by.

Hosts sharing a PostgreSQL store (docs/operations.md#several-hosts-on-one-store):
a sender runs only on the host that owns its connector (host.py starts it once
the ownership lock is held), so the owner alone sends the connector's rows,
whichever host's agent queued them. It learns of rows queued elsewhere by the
store's notification (store/outbox.py PUBLISH_CHANNEL) and, should one be
lost, from the host's look at the queue every SHARED_POLL_S: either way the
host calls `notify()` (speech/shared.py).
Before each try it asks `owned()` (store/hosts.py `Sharing.holds`): a host
whose session the server ended, its lock free for a standby, sends nothing
more and stops at its next heartbeat.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

import anyio
import structlog
from msgspec import Raw

from mcplhost.jsonobject import JsonObject
from mcplhost.protocol.answers import MalformedAnswer, PublishResult, decode_answer
from mcplhost.protocol.ports import ConnectorGone, ConnectorNotReady, ConnectorStopped, OutboxPort
from mcplhost.rpc import LineTooLong, RemoteError, RequestTimeout
from mcplhost.store.interfaces import Outbox
from mcplhost.store.items import NewItem
from mcplhost.store.operations import EndPublish, RecordPublishAttempt
from mcplhost.store.outbox import LAST_ERROR_MAX_CHARS, PendingPublish
from mcplhost.store.own_rows import notice_row
from mcplhost.store.rows import FailedReplyNotice
from mcplhost.store.writer import GroupWriter

from .notices import failed_reply_notice as failed_reply_notice_text
from .notices import not_permitted_reason
from .retry import GiveUp, RetryRules, after_failed_try, backoff_s, code_failure, too_old
from .routing import Destination, publish_refusal

log = structlog.get_logger()

#: Pending rows read per pass over the queue.
PENDING_PAGE = 256
#: Of those, at most this many of one channel: a channel in backoff leaves room for the others.
PENDING_PER_CHANNEL = 16
#: The method and its params' shape (MCPL spec, channels/publish).
PUBLISH_METHOD = "channels/publish"
#: Default `publish_max_age_s` for an agent the sender was not told about (docs/operations.md).
DEFAULT_MAX_AGE_S = 3600.0
#: While its connector is not ready (or stopped for good), how often the sender fails rows too old to send.
AGE_CHECK_S = 60.0
#: The reason, in the row and its notice's metadata, of a row the send-time check refused.
NOT_PERMITTED = "not_permitted"
#: The reason, in the row and its notice's metadata, of a row whose line would pass the connector's line cap.
TOO_LARGE = "too_large"
#: How long after its life became ready a connector may take to register a row's channel (again).
CHANNEL_GRACE_S = 10.0
#: While a row waits for its channel to be registered, how often the sender looks again.
CHANNEL_POLL_S = 0.1
#: The sender's restart backoff after an unexpected exception: 1 s doubling to 60 s.
SENDER_RESTART = RetryRules(first_s=1.0, max_s=60.0)
#: A row whose try ends in an unexpected exception this many times in a row fails, so it cannot stop the queue.
CRASHES_PER_ROW = 3
#: On a shared store, how often the host looks for pending rows anyway (speech/shared.py): a lost notification
#: only delays a row; also how long a sender whose host lost the connector's lock holds a row.
SHARED_POLL_S = 1.0


#: Why a row too old to send failed (its error and its notice's words).
TOO_OLD = "it waited longer than publish_max_age_s"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def expire_pending(outbox: Outbox, server_id: str, max_age_s: Mapping[str, float],
                         clock_ms: Callable[[], int], fail: Callable[[PendingPublish], Awaitable[None]]) -> int:
    """`fail` every pending row of `server_id` older than its agent's publish_max_age_s; how many.

    Reads the oldest first, a page at a time, until a page holds a row young enough to keep.
    """
    failed = 0
    while True:
        rows = await outbox.pending(server_id, limit=PENDING_PAGE)
        now = clock_ms()
        stale = [row for row in rows if too_old(row.created_at, now, max_age_s.get(row.agent, DEFAULT_MAX_AGE_S))]
        for row in stale:
            await fail(row)
        failed += len(stale)
        if len(stale) < PENDING_PAGE:
            return failed


def publish_params(row: PendingPublish) -> JsonObject:
    """channels/publish params for a row: the thread travels in the conversation id."""
    return {"conversationId": row.conversation_id, "channelId": row.channel_id, "stream": False,
            "content": [{"type": "text", "text": row.text}]}


def failed_reply_text(row: PendingPublish, label: str | None, reason: str) -> str:
    """The notice's words (speech/notices.py: the conversation by the header rules, and why), with the outbox id."""
    destination = Destination(server_id=row.server_id, channel_id=row.channel_id, thread_id=row.thread_id)
    return f"{failed_reply_notice_text(destination, label, reason)} (outbox id {row.id})"


def failed_reply_notice(row: PendingPublish, label: str | None, reason: str, *, at: int,
                        code: str | None = None) -> NewItem:
    """The `failed-reply` notice row for the row's agent; `code` names the reason."""
    destination = Destination(server_id=row.server_id, channel_id=row.channel_id, thread_id=row.thread_id)
    notice = FailedReplyNotice(outbox_id=row.id, turn_id=row.turn_id, reason=code or reason, destination=destination)
    return notice_row(row.agent, notice, failed_reply_text(row, label, reason), created_at=at,
                      conversation_id=row.conversation_id)


class OutboxSender:
    """Delivers one connector's outbox; `notify()` after queuing a publish, `run()` for the connector's life."""

    def __init__(self, outbox: Outbox, writer: GroupWriter, handle: OutboxPort, *, max_age_s: Mapping[str, float] | None = None,
                 rules: RetryRules = RetryRules(), clock_ms: Callable[[], int] = now_ms,
                 age_check_s: float = AGE_CHECK_S, restart_rules: RetryRules = SENDER_RESTART,
                 channel_grace_s: float = CHANNEL_GRACE_S, owned: Callable[[], Awaitable[bool]] | None = None,
                 ) -> None:
        self.outbox = outbox
        self.writer = writer
        self.handle = handle
        self.server_id: str = handle.name
        self.rules = rules
        self.age_check_s = age_check_s
        self.restart_rules = restart_rules
        self.channel_grace_s = channel_grace_s
        self.owned = owned  # None: one host; else asked before each try whether this host still owns the connector
        self._max_age_s = dict(max_age_s or {})
        self.clock_ms = clock_ms
        self._wake = anyio.Event()
        self._crashes = 0  # unexpected exceptions in a row, for the restart backoff
        self._trying: PendingPublish | None = None  # the row being tried, if the crash came with one
        self._row_crashes: tuple[int, int] = (0, 0)  # (row id, crashes in a row while trying it)
        self._life: int | None = None  # the connector life last seen ready (its number: handle.lives)
        self._life_ready_at = 0  # when this sender first saw that life ready (epoch ms)
        self.stats = {"delivered": 0, "failed": 0, "retried": 0, "crashed": 0}

    def notify(self) -> None:
        """Something was queued for this connector: look at the queue now."""
        self._wake.set()

    async def run(self) -> None:
        """Deliver until cancelled, restarting after an unexpected exception (the sender's boundary)."""
        log.debug("outbox.sender_started", connector=self.server_id)
        while True:
            try:
                await self._serve()
            except Exception:  # the boundary: a bug or a store fault must not end delivery, nor the host
                self._crashes += 1
                delay = backoff_s(self._crashes, self.restart_rules)
                self.stats["crashed"] += 1
                row, self._trying = self._trying, None
                log.error("outbox.sender_crashed", connector=self.server_id, crashes=self._crashes,
                          outbox_id=row.id if row is not None else None, restart_in_s=delay, exc_info=True)
                if row is not None:
                    await self._after_crash_on(row)
                await anyio.sleep(delay)

    async def _after_crash_on(self, row: PendingPublish) -> None:
        """Count a crash against the row being tried; fail it at CRASHES_PER_ROW (best effort: it may crash too)."""
        last, count = self._row_crashes
        count = count + 1 if last == row.id else 1
        self._row_crashes = (row.id, count)
        if count < CRASHES_PER_ROW:
            return
        try:
            await self._fail(row, f"the host failed {count} times trying to send it (see its log)")
        except Exception:  # the store itself may be what fails: the next restart tries again
            log.error("outbox.sender_crashed", connector=self.server_id, outbox_id=row.id, exc_info=True)

    async def _serve(self) -> None:
        """Deliver while the connector is ready; while it is not, only fail what is too old to send."""
        while True:
            if not await self._ready_within(self.age_check_s):
                await self.expire_old()
                continue
            self._note_life()
            wake = self._wake = anyio.Event()  # a notify from here on is seen by the wait below
            try:
                next_at = await self.deliver_due()
            except ConnectorNotReady:
                continue  # not ready any more: wait for the next life
            self._crashes = 0  # a whole pass went through: the next crash starts the backoff over
            if next_at == 0:
                continue  # sent something: look again at once
            with anyio.move_on_after(None if next_at is None else max(next_at - self.clock_ms(), 0) / 1000):
                await wake.wait()

    def _note_life(self) -> None:
        """Remember when this sender first saw the connector's current life ready (its number tells lives apart)."""
        life = self.handle.lives
        if life != self._life:
            self._life, self._life_ready_at = life, self.clock_ms()

    async def _ready_within(self, seconds: float) -> bool:
        """Whether the connector is ready within `seconds`; a connector stopped for good is not (after the wait)."""
        try:
            with anyio.move_on_after(seconds):
                await self.handle.wait_ready()
                return True
        except ConnectorStopped:
            await anyio.sleep(seconds)
        return False

    async def expire_old(self) -> int:
        """Fail, unsent and with a notice, every pending row older than its agent's publish_max_age_s; how many."""
        return await expire_pending(self.outbox, self.server_id, self._max_age_s, self.clock_ms, self._expire)

    async def _expire(self, row: PendingPublish) -> None:
        await self._fail(row, TOO_OLD, attempted=False)

    async def deliver_due(self) -> int | None:
        """One pass over the pending rows: 0 when any row ended, else the earliest retry time (None: no retry due).

        The oldest PENDING_PAGE rows first (one cheap indexed read); when every
        one of a full page waits behind a channel in backoff, a second read
        takes a few rows of every channel (PENDING_PER_CHANNEL), so the ready
        rows of the other channels are found however long that queue is.
        """
        self._trying = None  # a pass left by ConnectorNotReady may have left its row here
        blocked: dict[str, int] = {}  # channel → when its oldest row may be tried again (epoch ms)
        page = await self.outbox.pending(self.server_id, limit=PENDING_PAGE)
        ended = await self._deliver(page, blocked)
        if not ended and len(page) == PENDING_PAGE:
            fair = await self.outbox.pending(self.server_id, limit=PENDING_PAGE,
                                                   per_channel=PENDING_PER_CHANNEL)
            ended = await self._deliver(fair, blocked)
        return 0 if ended else min(blocked.values(), default=None)

    async def _deliver(self, rows: list[PendingPublish], blocked: dict[str, int]) -> bool:
        """Try each row not behind a waiting one of its channel (added to `blocked`); whether any row ended."""
        ended = False
        for row in rows:
            if row.channel_id in blocked:
                continue  # in order per channel: behind a row that waits
            now = self.clock_ms()
            if too_old(row.created_at, now, self._max_age_s.get(row.agent, DEFAULT_MAX_AGE_S)):
                await self._fail(row, TOO_OLD, attempted=False)
                ended = True
                continue
            if row.next_attempt_at > now:
                blocked[row.channel_id] = row.next_attempt_at
                continue
            self._trying = row
            retry_at = await self._checked_send(row, now)
            self._trying = None
            if retry_at is not None:
                blocked[row.channel_id] = retry_at
            else:
                ended = True
        return ended

    async def _checked_send(self, row: PendingPublish, now: int) -> int | None:
        """Try the row if its connector may publish there now (every try); else fail it, or wait for its channel."""
        refusal = publish_refusal(self.handle, row.channel_id)
        if refusal is None:
            return await self._send(row)
        grace_ends = self._life_ready_at + round(self.channel_grace_s * 1000)
        if refusal == "unknown" and now < grace_ends:
            return min(grace_ends, now + round(CHANNEL_POLL_S * 1000))  # not registered yet: look again soon
        await self._fail(row, not_permitted_reason(refusal), attempted=False, code=NOT_PERMITTED)
        return None

    async def _send(self, row: PendingPublish) -> int | None:
        """Try the row once; None when it ended (delivered or failed), else when to try it again (epoch ms)."""
        if not await self.outbox.is_pending(row.id):  # ended since it was read (a stop failed it)
            log.info("outbox.no_longer_pending", connector=self.server_id, outbox_id=row.id)
            return None
        if self.owned is not None and not await self.owned():  # the lock is gone: another host may send it
            log.warning("outbox.not_owned", connector=self.server_id, outbox_id=row.id)
            return self.clock_ms() + round(SHARED_POLL_S * 1000)
        started = self.clock_ms()
        try:
            raw = await self.handle.request(PUBLISH_METHOD, publish_params(row), result_type=Raw)
        except RemoteError as exc:
            # The connector's words: cut to what the row keeps anyway, before they reach the notice.
            error = f"the connector refused it ({exc.code}: {exc.message[:LAST_ERROR_MAX_CHARS]})"
            if code_failure(exc.code) == "permanent":
                await self._fail(row, error)
                return None
            return await self._retry(row, error, started)
        except RequestTimeout as exc:
            return await self._retry(row, f"no answer ({exc})", started)
        except ConnectorGone as exc:
            return await self._retry(row, f"the connection ended before the answer ({exc})", started)
        except LineTooLong as exc:  # never written: no try, and no retry could make it fit
            await self._fail(row, f"it is too large to send ({exc.size} bytes as a line; the connector's"
                                  f" line cap is {exc.limit})", attempted=False, code=TOO_LARGE)
            return None
        try:
            result = decode_answer(raw, PublishResult, PUBLISH_METHOD)
        except MalformedAnswer as exc:  # its detail is bounded: it reaches the row and the notice
            await self._fail(row, f"the connector's answer was not {{delivered, messageId}} ({exc.detail})")
            return None
        if not result.delivered:
            return await self._retry(row, "the connector answered delivered: false", started)
        at = self.clock_ms()
        ended = await self.writer.write(EndPublish(row.id, "delivered", at, message_id=result.messageId))
        if ended:
            self.outbox.remember_delivered(row.server_id, row.channel_id, result.messageId, row.id,
                                                 agent=row.agent, text=row.text)
        self.stats["delivered"] += 1
        self.handle.published()
        log.info("outbox.delivered", connector=row.server_id, channel=row.channel_id, thread=row.thread_id,
                 outbox_id=row.id, message_id=result.messageId, agent=row.agent, attempts=row.attempts + 1)
        return None

    async def _retry(self, row: PendingPublish, error: str, started: int) -> int | None:
        attempts = row.attempts + 1
        now = self.clock_ms()
        step = after_failed_try(attempts, row.first_attempt_at or started, now, error, self.rules)
        if isinstance(step, GiveUp):
            await self._fail(row, step.reason)
            return None
        await self.writer.write(RecordPublishAttempt(row.id, now, step.at, error))
        self.stats["retried"] += 1
        log.warning("outbox.retry", connector=row.server_id, channel=row.channel_id, outbox_id=row.id,
                    attempts=attempts, retry_in_ms=step.at - now, error=error)
        return step.at

    async def _fail(self, row: PendingPublish, reason: str, *, attempted: bool = True,
                    code: str | None = None) -> None:
        """End the row failed, with its agent's notice; None (nothing to retry). `code` names `reason` (not_permitted)."""
        at = self.clock_ms()
        channel = self.handle.channel(row.channel_id)
        notice = failed_reply_notice(row, channel.label if channel is not None else None, reason, at=at, code=code)
        error = reason if code is None else f"{code}: {reason}"
        await self.writer.write(EndPublish(row.id, "failed", at, error=error, attempted=attempted, notice=notice))
        self.stats["failed"] += 1
        log.warning("outbox.failed", connector=row.server_id, channel=row.channel_id, outbox_id=row.id,
                    agent=row.agent, reason=error)
