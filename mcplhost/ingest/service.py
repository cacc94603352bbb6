"""The host's side of the protocol's `Intake` port: admitted items become stored rows.

Each admitted message or push runs through the inbound pipeline (strip →
freeze-source → header → mark, with digests), then is committed through the
group writer; the connector's answer is built only after that commit.

Idempotence, enforced by the schema (store/items.py, store/pushes.py): a
channel message is stored once per (connector, channel, messageId,
sourceBodyDigest), so an identical redelivery (a retry after a lost
connection, a replay after a host crash between commit and answer) stores
nothing and is answered as the first delivery was; an edit has a new body
and is its own item. A push is stored once per (connector, eventId).

Stored events: after each commit, every newly stored item is offered as a
`Stored(id, item)` on the `events` stream Host hands in, dropped and flagged
when the consumer is behind, never waited for (ingest/events.py).

Echoes: a message or push that is this host's own delivered publish coming
back (same connector, channel and messageId) or tagged `chat:from-self` is
stored like any other, with `metadata.echoOf` and the tag `host:echo`, and
so wakes no one (agents/wake.py). Ingest knows the host's publishes only
through its `EchoPort` (ingest/ports.py; speech/echoes.py implements it),
seeded once before the first item so a restart forgets no recent publish.

Quotas (docs/operations.md#quotas): before storing, each message or push is
reserved in its connector's quota (ingest/connector_quotas.py: its sliding
hour, ingest/quotas.py), seeded from the store when the connector is first
heard from; one that would pass
`max_items_per_hour` or `max_bytes_per_hour` is refused with reason `quota`
(itemised per message, a -32603 error for a push), and the items stored are
counted in the store in their own commit. Local console input is not counted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from itertools import chain
from typing import Any

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectSendStream

from mcplhost.inbound.conversation import conversation_id
from mcplhost.inbound.pipeline import (
    Delivered,
    InFlight,
    Processed,
    Rejected,
    admit,
    run_pipeline,
)
from mcplhost.ingest.connector_quotas import ConnectorQuota, ConnectorQuotas
from mcplhost.ingest.events import StoredEmitter
from mcplhost.ingest.ports import EchoPort, IngestRepositories
from mcplhost.ingest.quotas import QuotaLimits, QuotaRefusal
from mcplhost.logs import LimitedLog, SuppressedTotals
from mcplhost.protocol import errors
from mcplhost.protocol.intake import AdmittedMessage, AdmittedPush, PushStored
from mcplhost.secrets import NO_SECRETS, Secrets
from mcplhost.store import (
    ItemRow,
    ItemWritten,
    NewItem,
    PushClaim,
    Stored,
    body_bytes,
    item_row,
    now_ms,
    row_content,
)
from mcplhost.store.writer import GroupWriter

EDITED_TAG = "chat:edited"
#: Recent (connector, channel, messageId) → thread, so a correction usually finds its original's
#: thread without a read.
RECENT_THREADS = 10_000
#: The answer to an accepted push.
PUSH_ACCEPTED: dict[str, Any] = {"accepted": True}

_encode = msgspec.json.encode
_decode = msgspec.json.decode


def _new_item(processed: Processed, participant: str | None, created_at: int, conversation: str | None,
              dedup_digest: str | None) -> NewItem:
    """The row to store for a processed item."""
    return NewItem(role="user", content=processed.content, metadata=processed.metadata, created_at=created_at,
                   participant=participant, thread_id=processed.delivered.thread_id,
                   conversation_id=conversation, dedup_digest=dedup_digest)


class Ingest:
    def __init__(self, store: IngestRepositories, writer: GroupWriter, log: Any, *, echoes: EchoPort,
                 clock_ms: Callable[[], int] = now_ms, on_stored: Callable[[list[NewItem]], None] | None = None,
                 events: MemoryObjectSendStream[Stored] | None = None, suppressed: SuppressedTotals | None = None,
                 quotas: Mapping[str, QuotaLimits] | None = None, secrets: Secrets = NO_SECRETS) -> None:
        self.store = store
        #: Redacted from every item before it is stored or offered to the agents (docs/agents.md#secrets).
        self.secrets = secrets
        self.echoes = echoes
        #: Set once the echo port is seeded from the store (by the first request, before its items).
        self._echoes_loaded: anyio.Event | None = None
        self.writer = writer
        self.log = log
        self.clock_ms = clock_ms
        self._emitter = StoredEmitter(log, events=events, on_stored=on_stored)
        self._redelivered = 0
        #: (connector, lane, "accepted" | "duplicate") → items: what the store did with each (metrics).
        self._items: dict[tuple[str, str, str], int] = {}
        self._suppressed = suppressed if suppressed is not None else SuppressedTotals()
        # Per connector (configured names only): the lines a connector's redeliveries cause. No driver runs
        # them, so a window's count comes with that connector's next such line (`statistics` has it at once).
        self._limited: dict[str, LimitedLog] = {}
        self._stripped: set[tuple[str, str]] = set()
        self._threads: OrderedDict[tuple[str, str, str], str | None] = OrderedDict()
        #: Per connector name, its quota; a connector not named in `quotas` has the default limits.
        self._quotas = ConnectorQuotas(store.quotas, log, quotas)

    @property
    def on_stored(self) -> Callable[[list[NewItem]], None] | None:
        """Called with the items new in each commit (e.g. `mcplhost dev`'s live view, the console's feed)."""
        return self._emitter.on_stored

    @on_stored.setter
    def on_stored(self, on_stored: Callable[[list[NewItem]], None] | None) -> None:
        self._emitter.on_stored = on_stored

    def content_problem(self, blocks: list[dict[str, Any]]) -> str | None:
        probe = Delivered(lane="push/event", kind="unscoped", server_id="", accepted_at=0, blocks=blocks)
        outcome = admit(InFlight(delivered=probe))
        return outcome.reason if isinstance(outcome, Rejected) else None

    async def store_messages(self, server_id: str, lane: str, messages: list[AdmittedMessage]) -> list[dict[str, Any]]:
        accepted_at = self.clock_ms()
        if self._echoes_loaded is None or not self._echoes_loaded.is_set():
            await self._load_echoes(accepted_at)
        quota = self._quotas.get(server_id) or await self._quotas.of(server_id, accepted_at)
        outcomes: list[Processed | Rejected | QuotaRefusal] = []
        threads: list[str | None] = []
        # Each processed message's row, built once: its content's size is what the quota counts, its texts are
        # what the secret search reads, and its values are what the INSERT writes (docs/architecture.md#the-inbound-hot-path).
        built: dict[int, tuple[NewItem, ItemRow]] = {}
        sizes: dict[int, int] = {}
        conversations: dict[tuple[str, str | None], str] = {}  # a batch is mostly one conversation
        for index, m in enumerate(messages):
            thread_id = m.thread_id
            if thread_id is None and EDITED_TAG in m.tags:
                thread_id = await self._original_thread(server_id, m.channel_id, m.message_id)
            threads.append(thread_id)
            outcome: Processed | Rejected | QuotaRefusal = run_pipeline(Delivered(
                lane=lane, kind="channel", server_id=server_id, accepted_at=accepted_at, blocks=m.content,
                adapter=m.metadata, channel_id=m.channel_id, label=m.label, thread_id=thread_id,
                message_id=m.message_id, reply_to=m.reply_to, source_timestamp=m.source_timestamp,
                tags=list(m.tags), participant=m.participant, author_id=m.author_id))
            if isinstance(outcome, Processed):
                outcome = self._echo_marked(server_id, outcome)
                place = (m.channel_id, outcome.metadata["threadId"])
                conversation = conversations.get(place)
                if conversation is None:
                    conversation = conversations[place] = conversation_id(server_id, *place)
                item = _new_item(outcome, m.participant, accepted_at, conversation,
                                 outcome.metadata["sourceBodyDigest"])
                row = item_row(item)
                built[index] = (item, row)
                sizes[index] = len(row_content(row))  # body_bytes: the content as stored
            outcomes.append(outcome)
        if quota.reserve_all(accepted_at, len(sizes), sum(sizes.values())):  # the usual case: one check
            admitted = {index: (size, True) for index, size in sizes.items()}
        else:
            admitted = await self._reserve_messages(server_id, quota, accepted_at, messages, outcomes, sizes)
        items: list[NewItem] = []
        rows: list[ItemRow] = []
        charged: list[int] = []
        reserved: list[bool] = []
        for index, (m, thread_id, outcome) in enumerate(zip(messages, threads, outcomes, strict=True)):
            if isinstance(outcome, Processed):
                self._remember_thread(server_id, m.channel_id, m.message_id, thread_id)
                self._log_stripped(server_id, outcome)
                item, row = built[index]
                items.append(item)
                rows.append(row)
                size, held = admitted[index]
                charged.append(size)
                reserved.append(held)
        searched = None
        if self.secrets:
            version = self.secrets.version
            # One search over the request's rows, the store writer's own (store/db.py), which then skips it.
            if not self.secrets.find_in_values(chain.from_iterable(rows)):
                searched = version
            else:  # a secret somewhere in them: each item as before, redacted here and its row by the writer
                items = [self._redacted(item) for item in items]
                rows = [item_row(item) for item in items]
        written = (await self._store_charged(server_id, quota, accepted_at, items, charged, reserved, rows, searched)
                   if items else [])
        self._emitter.emit(items, written)
        repeats = [w.id for w in written if w.duplicate]
        self._count(server_id, lane, accepted=len(written) - len(repeats), duplicate=len(repeats))
        if repeats:  # one line per request, however many it repeated (a replay after a restart can be long)
            self._redelivered += len(repeats)
            self._limited_for(server_id).info("ingest.redelivered", duplicates=len(repeats),
                                              first_original=repeats[0])
        results = []
        stored = iter(zip(items, written))
        for message, outcome in zip(messages, outcomes):
            if isinstance(outcome, QuotaRefusal):
                refused = errors.quota_reached(outcome.quota, outcome.retry_after_ms)
                results.append({"messageId": message.message_id, "accepted": False,
                                "reason": errors.QUOTA_REASON, "code": refused.code, **refused.data})
                continue
            if isinstance(outcome, Rejected):
                results.append({"messageId": message.message_id, "accepted": False, "reason": outcome.reason,
                                "code": errors.INVALID_PARAMS})
                continue
            item, result = next(stored)
            # A repeat is answered with its original's conversation (rows from before
            # migration 0002 have none stored, and the same place gives the same id).
            results.append({"messageId": message.message_id, "accepted": True,
                            "conversationId": result.conversation_id or item.conversation_id})
        return results

    async def store_push(self, server_id: str, push: AdmittedPush) -> PushStored:
        accepted_at = self.clock_ms()
        await self._load_echoes(accepted_at)
        processed = run_pipeline(Delivered(
            lane="push/event", kind="channel" if push.channel_id else "unscoped", server_id=server_id,
            accepted_at=accepted_at, blocks=push.content, adapter=push.origin, channel_id=push.channel_id,
            label=push.label, thread_id=push.thread_id, message_id=push.message_id, event_id=push.event_id,
            feature_set=push.feature_set, reply_to=push.reply_to, source_timestamp=push.source_timestamp,
            tags=list(push.tags)))
        if isinstance(processed, Rejected):
            raise errors.invalid_params(f"push payload refused: {processed.reason}", {"reason": processed.reason})
        processed = self._echo_marked(server_id, processed)
        # An unscoped push belongs to no conversation (docs/agents.md#routing: it is undecided).
        conversation = (conversation_id(server_id, push.channel_id, processed.metadata["threadId"])
                        if push.channel_id else None)
        item = self._item(server_id, processed, push.participant, accepted_at, conversation=conversation)
        quota = await self._quotas.of(server_id, accepted_at)
        size = body_bytes(item.content)
        # A repeat of a recorded event stores nothing: near the quota, it is answered, not refused.
        reserved = (quota.fits(accepted_at, 1, size)
                    or await self.store.pushes.get(server_id, push.event_id) is None)
        refusal = quota.charge(accepted_at, size) if reserved else None
        if refusal is not None:
            raise errors.quota_reached(refusal.quota, refusal.retry_after_ms)
        try:
            written = await self.writer.store_push(
                PushClaim(server_id, push.event_id, _encode(PUSH_ACCEPTED), accepted_at), item, body_bytes=size)
        except Exception:  # the commit failed: nothing is stored, nothing counted
            if reserved:
                quota.release(accepted_at, size)
            raise
        if written.duplicate and reserved:  # a repeat stores nothing, so it takes nothing of the quota
            quota.release(accepted_at, size)
        if not written.duplicate:
            self._emitter.emit([item], [ItemWritten(written.item_id, False, conversation)])
        self._count(server_id, "push/event", accepted=int(not written.duplicate), duplicate=int(written.duplicate))
        return PushStored(answer=_decode(written.answer), item_id=written.item_id, duplicate=written.duplicate)

    async def store_surface(self, surface: str, participant: str, text: str) -> None:
        """Store local console input: a `surface` item, marked like any sender's text, with no header."""
        accepted_at = self.clock_ms()
        processed = run_pipeline(Delivered(
            lane="surface", kind="surface", server_id=surface, accepted_at=accepted_at,
            blocks=[{"type": "text", "text": text}], participant=participant))
        if isinstance(processed, Rejected):
            raise ValueError(f"console input refused: {processed.reason}")
        item = self._item(surface, processed, participant, accepted_at)
        self._emitter.emit([item], await self.writer.store_items([item]))

    def set_quotas(self, quotas: Mapping[str, QuotaLimits]) -> None:
        """New per-connector limits (a reload): they apply to the next item; the hour's counts are kept."""
        self._quotas.set_limits(quotas)

    def reseed_quota(self, server_id: str) -> None:
        """This host takes the connector over (a shared store): its next item re-reads the hour from the store."""
        self._quotas.forget(server_id)

    async def _reserve_messages(self, server_id: str, quota: ConnectorQuota, now: int,
                                messages: list[AdmittedMessage], outcomes: list[Processed | Rejected | QuotaRefusal],
                                sizes: dict[int, int]) -> dict[int, tuple[int, bool]]:
        """Near the quota: reserve each processed message, or replace its outcome by the refusal.

        Returns, per admitted message's index, its body bytes and whether it holds a reservation. A
        redelivery (stored already, or earlier in this batch) stores nothing, so it passes unreserved
        instead of being refused: one indexed read per message, only here.
        """
        admitted: dict[int, tuple[int, bool]] = {}
        passed: set[tuple[str, str, str]] = set()
        for index, size in sizes.items():
            outcome = outcomes[index]
            assert isinstance(outcome, Processed)
            m = messages[index]
            key = (m.channel_id, m.message_id, outcome.metadata["sourceBodyDigest"])
            if key in passed or await self.store.items.is_stored(server_id, *key):
                admitted[index] = (size, False)
                continue
            refusal = quota.charge(now, size)
            if refusal is not None:
                outcomes[index] = refusal
                continue
            passed.add(key)
            admitted[index] = (size, True)
        return admitted

    async def _store_charged(self, server_id: str, quota: ConnectorQuota, accepted_at: int, items: list[NewItem],
                             sizes: list[int], reserved: list[bool], rows: list[ItemRow],
                             searched: object) -> list[ItemWritten]:
        """Store items counted in the connector's quota; a reservation that stored nothing is given back."""
        try:
            written = await self.writer.store_items(items, charged_to=server_id, body_bytes=sizes, rows=rows,
                                                    searched=searched)
        except Exception:  # the commit failed: nothing is stored, nothing counted
            for size, held in zip(sizes, reserved, strict=True):
                if held:
                    quota.release(accepted_at, size)
            raise
        for size, held, result in zip(sizes, reserved, written, strict=True):
            if held and result.duplicate:  # a redelivery stores nothing, so it takes nothing of the quota
                quota.release(accepted_at, size)
        return written

    async def _load_echoes(self, now: int) -> None:
        """Before the first item: the echo port seeded from the store, so a restart forgets no recent publish."""
        if self._echoes_loaded is not None:
            await self._echoes_loaded.wait()  # a concurrent first request: mark nothing before the seed is in
            return
        self._echoes_loaded = anyio.Event()
        try:
            remembered = await self.echoes.seed(now)
            if remembered:
                self.log.info("ingest.echoes_loaded", delivered=remembered)
        finally:
            self._echoes_loaded.set()

    def _echo_marked(self, server_id: str, processed: Processed) -> Processed:
        """The item marked as the echo of this host's own publish when it is one (the echo port decides)."""
        marked = self.echoes.marked(processed)
        if marked.echo_of is not None:  # at most one line per publish: the platform shows each once
            d = marked.delivered
            self.log.info("ingest.echo", connector=server_id, channel=d.channel_id, message=d.message_id,
                          echo_of=marked.echo_of)
        return marked

    async def _original_thread(self, server_id: str, channel_id: str, message_id: str) -> str | None:
        """The thread of the message a correction corrects (docs/provenance.md §2), recent ones from memory."""
        remembered = self._threads.get((server_id, channel_id, message_id))
        if remembered is not None:
            return remembered
        return await self.store.items.thread_of(server_id, channel_id, message_id)

    def _remember_thread(self, server_id: str, channel_id: str, message_id: str, thread_id: str | None) -> None:
        key = (server_id, channel_id, message_id)
        if thread_id is None:
            # Only threads are worth remembering; a miss costs one read, and only for a correction.
            self._threads.pop(key, None)
            return
        self._threads[key] = thread_id
        self._threads.move_to_end(key)
        if len(self._threads) > RECENT_THREADS:
            self._threads.popitem(last=False)

    def _item(self, server_id: str, processed: Processed, participant: str | None, created_at: int, *,
              conversation: str | None = None, dedup_digest: str | None = None) -> NewItem:
        self._log_stripped(server_id, processed)
        return self._redacted(_new_item(processed, participant, created_at, conversation, dedup_digest))

    def _log_stripped(self, server_id: str, processed: Processed) -> None:
        for key in processed.stripped_keys:
            if (server_id, key) not in self._stripped:
                # Once per (connector, key) per process; the key, never its value.
                self._stripped.add((server_id, key))
                self.log.warning("inbound.host_key_stripped", connector=server_id, key=key)

    def _redacted(self, item: NewItem) -> NewItem:
        """`item` with the secrets in its content and metadata redacted: the agents' events carry this very item."""
        if not self.secrets or not self.secrets.find_json([item.content, item.metadata]):
            return item
        return msgspec.structs.replace(item, content=self.secrets.redact_json(item.content),
                                       metadata=self.secrets.redact_json(item.metadata))

    def statistics(self) -> dict[str, int]:
        """Stored events offered and dropped so far (dropped: the consumer was behind); redelivered items."""
        return {"stored_events": self._emitter.offered, "stored_events_dropped": self._emitter.dropped,
                "redelivered": self._redelivered}

    def item_counts(self) -> dict[tuple[str, str, str], int]:
        """(connector, lane, outcome) → items since the start: `accepted` (stored) or `duplicate` (stored nothing).

        Refused items are counted where the answer is built (mcplhost/protocol/counts.py).
        """
        return dict(self._items)

    def _count(self, server_id: str, lane: str, *, accepted: int, duplicate: int) -> None:
        for outcome, count in (("accepted", accepted), ("duplicate", duplicate)):
            if count:
                key = (server_id, lane, outcome)
                self._items[key] = self._items.get(key, 0) + count

    def quota_statistics(self) -> dict[str, dict[str, int | bool]]:
        """Per connector heard from: its usage over the sliding hour and its quota refusals since the start.

        `{"items": n, "bytes": n, "maxItems": n, "maxBytes": n, "refusedItems": n, "refusedBytes": n,
        "reached": bool}`; `reached`: in a spell of refusals now (docs/operations.md#quotas).
        """
        return self._quotas.statistics(self.clock_ms())

    def _limited_for(self, server_id: str) -> LimitedLog:
        limited = self._limited.get(server_id)
        if limited is None:
            limited = self._limited[server_id] = LimitedLog(self.log.bind(connector=server_id),
                                                            tally=self._suppressed.tally_for(server_id))
        return limited
