"""Speech on a store several hosts share (docs/operations.md#several-hosts-on-one-store).

    await base.start(partial(serve_shared_outbox, session.listen, host.outbox_senders, store, writer, owned, max_age))

Publishes queued on any host: the store's notification (store/outbox.py
PUBLISH_CHANNEL, payload the connector's name) wakes this host's sender of
that connector, if it has one; only a running sender sends, and one runs only
where its connector is owned (speech/outbox.py). Every SHARED_POLL_S the host
also reads which connectors have pending rows (one indexed read for all of
them) and wakes those senders, so a lost notification only delays a publish.

Publishes whose connector no live host owns wait, and fail once older than
publish_max_age_s. On a shared store a row is sent
by the owner of its connector (speech/outbox.py), and that sender also fails
its rows too old to send. A connector no live host owns (its host died with no
standby, or no host is configured for it) has no sender: every host sharing
the store looks every `check_s` at the connectors with pending rows, and fails
the too old rows of those no live host owns, with the same notice a sender
writes. Two hosts may fail one row at once: the end is conditional on the row
still pending (store/outbox.py `end_many_nocommit`), so it ends once, with one
notice. A row's age bound is its agent's `publish_max_age_s` where this host
knows the agent, else DEFAULT_MAX_AGE_S.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from functools import partial

import anyio
import structlog
from anyio.abc import TaskStatus

from mcplhost.store.interfaces import Repositories
from mcplhost.store.operations import EndPublish
from mcplhost.store.outbox import PUBLISH_CHANNEL, PendingPublish
from mcplhost.store.writer import GroupWriter

from .outbox import AGE_CHECK_S, SHARED_POLL_S, TOO_OLD, OutboxSender, expire_pending, failed_reply_notice, now_ms

log = structlog.get_logger()

#: The connectors some live host owns now (store/hosts.py `Sharing.live_hosts`, this host's included).
OwnedNow = Callable[[], Awaitable[Collection[str]]]
#: LISTEN on a channel with a callback for each payload (store/connection.py `Session.listen`).
Listen = Callable[[str, Callable[[str], None]], Awaitable[None]]


async def expire_unowned(store: Repositories, writer: GroupWriter, owned: OwnedNow, max_age_s: Mapping[str, float],
                         clock_ms: Callable[[], int] = now_ms) -> int:
    """One look: fail the too old pending rows of every connector no live host owns; how many."""
    async def fail(row: PendingPublish) -> None:
        at = clock_ms()
        notice = failed_reply_notice(row, None, TOO_OLD, at=at)
        if await writer.write(EndPublish(row.id, "failed", at, error=TOO_OLD, attempted=False, notice=notice)):
            log.warning("outbox.failed", connector=row.server_id, channel=row.channel_id, outbox_id=row.id,
                        agent=row.agent, reason=TOO_OLD, owner=None)

    waiting = await store.outbox.pending_connectors()
    if not waiting:
        return 0
    taken = set(await owned())
    return sum([await expire_pending(store.outbox, name, max_age_s, clock_ms, fail) for name in waiting if name not in taken])


async def run_unowned_expiry(store: Repositories, writer: GroupWriter, owned: OwnedNow,
                             max_age_s: Mapping[str, float], *, check_s: float = AGE_CHECK_S,
                             clock_ms: Callable[[], int] = now_ms) -> None:
    """`expire_unowned` every `check_s` until cancelled; a failed look (the store) is logged and tried again."""
    while True:
        await anyio.sleep(check_s)
        try:
            await expire_unowned(store, writer, owned, max_age_s, clock_ms)
        except Exception:  # the boundary: a store fault must not end the host; the next look tries again
            log.error("outbox.unowned_check_failed", exc_info=True)


async def serve_shared_outbox(listen: Listen, senders: Mapping[str, OutboxSender], store: Repositories,
                              writer: GroupWriter, owned: OwnedNow, max_age_s: Mapping[str, float], *,
                              poll_s: float = SHARED_POLL_S, check_s: float = AGE_CHECK_S,
                              task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Wake this host's sender of each connector with new rows (notified, or found every `poll_s`); fail unowned
    rows too old every `check_s`. Runs until cancelled.

    `senders` is read each time (a reload adds and removes senders); a name this host has no
    sender for is nobody's here.
    """
    def heard(connector: str) -> None:
        sender = senders.get(connector)
        if sender is not None:
            sender.notify()

    await listen(PUBLISH_CHANNEL, heard)
    task_status.started()
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(run_unowned_expiry, store, writer, owned, max_age_s, check_s=check_s))
        while True:
            await anyio.sleep(poll_s)
            try:
                for connector in await store.outbox.pending_connectors():
                    heard(connector)
            except Exception:  # the boundary: a store fault must not end the host; the next look tries again
                log.error("outbox.pending_check_failed", exc_info=True)
