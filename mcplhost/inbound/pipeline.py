"""The inbound pipeline: what the host stores for one delivered item.

docs/provenance.md, all of it, in order::

    admit → strip → freeze-source → header → mark → (digests, metadata)

Each stage is a small pure function from one frozen `InFlight` to the next
(built with `msgspec.structs.replace`) or to a `Rejected(reason)`, the
connector-facing refusal. `STAGES` is the table; `run_pipeline` runs the
same stages' cores in that order on plain values, building no `InFlight`
between them (it runs for every inbound item; tests/inbound/test_pipeline.py
checks it against the table).
Nothing here reads a clock, a config or a logger: the caller passes the
acceptance time and the configured names in the `Delivered` item, and logs
`Processed.stripped_keys` once per (server, key) itself.

`admit` comes first because docs/provenance.md §5 takes the delivered body's
digest after its conversion to content blocks, and docs/provenance.md §0
refuses an empty push at admission:

- Each block is rebuilt from the members its type defines, so a connector
  cannot smuggle other members into a stored block: text (`type`, `text`);
  image and audio (`type`, `data`, `mimeType`, or else `type`, `uri`);
  resource (`type`, `uri`). A block of any other type, or one missing its
  members, refuses the item as "invalid_content" rather than dropping part
  of what the sender said.
- A push/event item with no visible content is refused as "empty_content".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from msgspec.structs import replace

# The pipeline builds every block from its known string members, so its blocks
# always take the digest's fast path without being checked again.
from mcplhost.errors import HostStateError
from mcplhost.inbound.digest import converted_body_digest as body_digest
from mcplhost.inbound.header import render_source_header, source_header
from mcplhost.inbound.mark import mark_openings
from mcplhost.inbound.source import freeze_source
from mcplhost.inbound.strip import strip_host_keys
from mcplhost.inbound.visible import has_visible_content
from mcplhost.jsonobject import JsonObject

T = TypeVar("T")

__all__ = ["STAGES", "Delivered", "InFlight", "Processed", "Rejected", "run_pipeline"]


class Delivered(msgspec.Struct, frozen=True, kw_only=True):
    """One inbound item as the host accepted it, before any stage ran.

    `server_id` is the configured connector name and `channel_id` the
    registered channel id (never values the connector claims); `adapter` is
    the connector's `metadata` or `origin` object as sent; `accepted_at` is
    host time in epoch milliseconds.
    """

    lane: str
    kind: str
    server_id: str
    accepted_at: int
    blocks: list[dict[str, Any]]
    adapter: dict[str, Any] | None = None
    channel_id: str | None = None
    label: str | None = None
    thread_id: str | None = None
    message_id: str | None = None
    event_id: str | None = None
    feature_set: str | None = None  # a push's featureSet; None for channel and local items
    reply_to: str | None = None
    source_timestamp: Any = None
    tags: list[str] = msgspec.field(default_factory=list)
    participant: str | None = None
    author_id: str | None = None  # the sender's platform id; stored as metadata.authorId when known


class InFlight(msgspec.Struct, frozen=True, kw_only=True):
    """An item between stages; each stage fills in what it owns."""

    delivered: Delivered
    content: list[dict[str, Any]] | None = None  # admit: blocks as delivered, converted
    adapter: dict[str, Any] | None = None  # strip: the connector's object without host keys
    stripped_keys: tuple[str, ...] = ()  # strip
    source: dict[str, Any] | None = None  # freeze-source
    header: str | None = None  # header (None for surface items)
    stored: list[dict[str, Any]] | None = None  # mark: header block + marked content


class Rejected(msgspec.Struct, frozen=True):
    """The item is refused and never stored; `reason` says why.

    The connector broke the rules for this one item, so the caller answers
    it with -32602 (invalid params) and carries on: "empty_content" (a push
    with nothing visible) or "invalid_content" (an unknown or malformed block).
    """

    reason: str


class Processed(msgspec.Struct, frozen=True, kw_only=True):
    """What the store writes: the content blocks and the item's metadata, with the item it was made from.

    `delivered`'s ids are the ones `metadata` holds (serverId, channelId, messageId, threadId; its tags
    before the echo mark), so the layers above read them typed there; `echo_of` is `metadata.echoOf`, set
    only by the echo mark (mcplhost/ingest/ports.py).
    """

    content: list[dict[str, Any]]
    metadata: dict[str, Any]
    delivered: Delivered
    stripped_keys: tuple[str, ...] = ()
    echo_of: int | bool | None = None


Stage = Callable[[InFlight], "InFlight | Rejected"]


def _filled(value: T | None, stage: str) -> T:
    """What `stage` put in the item; it is missing only if the stages ran out of STAGES' order (a bug)."""
    if value is None:
        raise HostStateError(f"inbound pipeline: {stage} has not run")
    return value

# --------------------------------------------------------------------------- admit


def _converted(block: Any) -> JsonObject | None:
    """`block` rebuilt from its type's own members, or None when it has none."""
    if not isinstance(block, dict):
        return None
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        return {"type": "text", "text": text} if isinstance(text, str) else None
    if kind in ("image", "audio"):
        data, mime_type, uri = block.get("data"), block.get("mimeType"), block.get("uri")
        if isinstance(data, str) and isinstance(mime_type, str):
            return {"type": kind, "data": data, "mimeType": mime_type}
        return {"type": kind, "uri": uri} if isinstance(uri, str) else None
    if kind == "resource":
        uri = block.get("uri")
        return {"type": "resource", "uri": uri} if isinstance(uri, str) else None
    return None


_INVALID_CONTENT = Rejected("invalid_content")
_EMPTY_CONTENT = Rejected("empty_content")


def _admitted(d: Delivered) -> list[dict[str, Any]] | Rejected:
    """The delivered blocks converted, or why the item is refused."""
    content = []
    for block in d.blocks:
        converted = _converted(block)
        if converted is None:
            return _INVALID_CONTENT
        content.append(converted)
    if d.lane == "push/event" and not has_visible_content(content):
        return _EMPTY_CONTENT
    return content


def admit(item: InFlight) -> InFlight | Rejected:
    """Convert the delivered blocks; refuse unknown blocks and an empty push."""
    content = _admitted(item.delivered)
    return content if isinstance(content, Rejected) else replace(item, content=content)


# --------------------------------------------------------------------------- strip


def _stripped(adapter: dict[str, Any] | None) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    kept, dropped = strip_host_keys(adapter)
    return (None if adapter is None else kept), dropped  # no object sent: stored as null, not {}


def strip(item: InFlight) -> InFlight:
    """Keep the connector's object apart, without the host's keys (docs/provenance.md §1)."""
    adapter, dropped = _stripped(item.delivered.adapter)
    return replace(item, adapter=adapter, stripped_keys=dropped)


# --------------------------------------------------------------------------- freeze-source


def _reply_to(d: Delivered, adapter: dict[str, Any] | None) -> str | None:
    """The item's own replyTo, else the connector object's when that is a string (docs/provenance.md §2)."""
    if d.reply_to is None and adapter is not None:
        claimed = adapter.get("replyTo")
        return claimed if isinstance(claimed, str) else None
    return d.reply_to


def _source(d: Delivered, reply_to: str | None) -> JsonObject:
    return freeze_source(
        kind=d.kind,
        lane=d.lane,
        server_id=d.server_id,
        accepted_at=d.accepted_at,
        channel_id=d.channel_id,
        label=d.label,
        thread_id=d.thread_id,
        message_id=d.message_id,
        event_id=d.event_id,
        reply_to=reply_to,
        source_timestamp=d.source_timestamp,
    )


def freeze(item: InFlight) -> InFlight:
    """Record where the item came from, once (docs/provenance.md §2).

    `replyTo` is the message's own member, else its metadata's `replyTo`
    when that is a string.
    """
    return replace(item, source=_source(item.delivered, _reply_to(item.delivered, item.adapter)))


# --------------------------------------------------------------------------- header


def header(item: InFlight) -> InFlight:
    """Render the header from the frozen envelope (docs/provenance.md §3); none for surface items."""
    return replace(item, header=render_source_header(_filled(item.source, "freeze")))


# --------------------------------------------------------------------------- mark


def _stored(content: list[dict[str, Any]], header: str | None) -> list[dict[str, Any]]:
    marked = mark_openings(content)
    if header is not None:
        marked.insert(0, {"type": "text", "text": header})
    return marked


def mark(item: InFlight) -> InFlight:
    """Mark the sender's openings, then put the header block first (docs/provenance.md §4)."""
    return replace(item, stored=_stored(_filled(item.content, "admit"), item.header))


STAGES: tuple[Stage, ...] = (admit, strip, freeze, header, mark)


def _metadata(item: InFlight) -> JsonObject:
    """The item's metadata, in the shape of docs/provenance.md §6."""
    return _metadata_of(item.delivered, _filled(item.source, "freeze"), item.header, _filled(item.content, "admit"),
                        _filled(item.stored, "mark"), item.adapter)


def _metadata_of(d: Delivered, source: dict[str, Any], header: str | None, content: list[dict[str, Any]],
                 stored: list[dict[str, Any]], adapter: dict[str, Any] | None) -> JsonObject:
    metadata: dict[str, Any] = {
        "serverId": d.server_id,  # the ids as the frozen envelope holds them, null where it has none
        "channelId": d.channel_id,
        "messageId": d.message_id,
        "threadId": d.thread_id,
        "eventId": d.event_id,
        "featureSet": d.feature_set,
        "tags": list(d.tags),
        "source": source,
        "sourceHeader": header,
        "sourceBodyDigest": body_digest(content),
        "storedBodyDigest": body_digest(stored),
        "adapter": adapter,
    }
    if header is None:
        del metadata["sourceHeader"]  # a surface item has no header to name
    if d.author_id is not None:
        # Host-written beside the connector's object, never read from metadata.adapter (docs/provenance.md §1); absent
        # when the connector named no author id, rather than null on every push.
        metadata["authorId"] = d.author_id
    return metadata


def run_pipeline(d: Delivered) -> Processed | Rejected:
    """Run every stage over `d`; the first refusal ends the run.

    The same steps as STAGES, in their order, on plain values: the stages' own
    cores called one after the other, with no `InFlight` built between them
    (this runs for every inbound item).
    """
    content = _admitted(d)
    if isinstance(content, Rejected):
        return content
    adapter, dropped = _stripped(d.adapter)
    reply_to = _reply_to(d, adapter)
    source = _source(d, reply_to)
    head = source_header(d.kind, d.server_id, d.channel_id, d.label, d.thread_id, reply_to)
    stored = _stored(content, head)
    return Processed(content=stored, metadata=_metadata_of(d, source, head, content, stored, adapter), delivered=d,
                     stripped_keys=dropped)
