"""What a stored row is, typed: the keys any item's metadata may carry, its frozen source, and the host's row kinds.

A row's metadata is JSON the host wrote (docs/provenance.md §6, docs/agents.md#compilation). Above store/ it is
read through these Structs, never probed as a dict:

    item.meta.source            # ChannelSource | UnscopedSource | SurfaceSource | None (`metadata.source`)
    item.meta.author_id         # ItemMeta: ids, tags, header, author, echo mark, conversation
    match item.host:            # what an agent's own row is, or None
        case SpeechMeta(destination=where): ...
        case FailedReplyNotice(outbox_id=outbox_id): ...

`item_meta` and `host_row` decode a metadata dict once (store/items.py caches them on each row), and
read as a tolerant reader of what another version wrote must: an absent key reads as its field's default,
and so does a value of the wrong type (as the dict probes these replace read it), without losing the
rest of the row. A row whose kind needs a member it lacks (a tool call without its id) is no row of that
kind (`host_row` None). The export (`export_line`) is the one place a row is its dict again.

The Structs are also what the host writes (`row_metadata`, store/own_rows.py): one Struct per row shape,
its fields in the order the rows were always written in. Members a row has only sometimes
(`conversationId`, `failureReply`, `outboxIds`, a peer row's `turnId` …) are UNSET when absent, so they
are left out, not written as null; a notice's `kind` and `system` follow its other members.
"""

from __future__ import annotations

import functools
from types import UnionType
from typing import Any, TypeVar, get_args, get_origin

import msgspec
from msgspec import UNSET, UnsetType

from mcplhost.inbound.conversation import conversation_id
from mcplhost.inbound.notice import SOURCE_HEADER_NOTICE_KIND
from mcplhost.jsonobject import JsonObject

__all__ = [
    "HOST_KINDS",
    "NOTICE_KINDS",
    "ChannelSource",
    "Destination",
    "DraftMeta",
    "DraftsNotice",
    "FailedReplyNotice",
    "HostRow",
    "ItemMeta",
    "Notice",
    "NoticeRow",
    "PeerFrom",
    "PeerMeta",
    "Source",
    "SourceHeaderNotice",
    "SpeechMeta",
    "SurfaceSource",
    "ToolCallMeta",
    "ToolResultMeta",
    "TurnFailedNotice",
    "UnscopedSource",
    "host_row",
    "item_meta",
    "row_metadata",
]

S = TypeVar("S", bound=msgspec.Struct)


class Destination(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Where a speech row was sent: one conversation of one connector (`metadata.destination`)."""

    server_id: str
    channel_id: str
    thread_id: str | None = None

    def conversation_id(self) -> str:
        return conversation_id(self.server_id, self.channel_id, self.thread_id)


# --------------------------------------------------------------------------- the source envelope


class _Source(msgspec.Struct, frozen=True, kw_only=True, rename="camel", tag_field="kind"):
    """`metadata.source`, the envelope freeze-source wrote once (docs/provenance.md §2); its kind is the tag."""

    lane: str | None = None  # channels/incoming, push/event, surface
    server_id: str | None = None
    channel_id: str | None = None
    label: str | None = None
    thread_id: str | None = None
    message_id: str | None = None
    event_id: str | None = None
    reply_to: str | None = None
    accepted_at: int | None = None  # host epoch ms

    @property
    def kind(self) -> str:
        return str(type(self).__struct_config__.tag)


class ChannelSource(_Source, tag="channel", frozen=True):
    """A channel's item: a message (lane channels/incoming) or a push naming a registered channel."""


class UnscopedSource(_Source, tag="unscoped", frozen=True):
    """A push that names no channel: it belongs to no conversation."""


class SurfaceSource(_Source, tag="surface", frozen=True):
    """Local console input: no connector, no lane of MCPL's (its lane is `surface`)."""


Source = ChannelSource | UnscopedSource | SurfaceSource


class ItemMeta(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The host-written keys any row's metadata may have beside its kind (never `metadata.adapter`)."""

    server_id: str | None = None
    channel_id: str | None = None
    message_id: str | None = None
    thread_id: str | None = None
    tags: tuple[str, ...] = ()
    source: Source | None = None
    source_header: str | None = None
    source_body_digest: str | None = None  # docs/provenance.md §5
    stored_body_digest: str | None = None
    author_id: str | None = None  # the sender's platform id (docs/provenance.md §1)
    echo_of: int | bool | None = None  # the outbox id of the publish it echoes, or True: tagged from-self only
    conversation_id: str | None = None  # an agent row's own (docs/agents.md#compilation)


# --------------------------------------------------------------------------- an agent's own rows


class _Host(msgspec.Struct, frozen=True, kw_only=True, rename="camel", tag_field="kind"):
    """A host row kind; `kind` in the metadata is its tag."""

    @property
    def kind(self) -> str:
        return str(type(self).__struct_config__.tag)


class SpeechMeta(_Host, tag="speech", frozen=True):
    """What the agent said (`assistant`); `destination` once the speech router decided one."""

    turn_id: int | None = None
    destination: Destination | None = None
    outbox_id: int | None = None  # the first outbox row's (store/operations.py PublishSpeech)
    conversation_id: str | UnsetType = UNSET
    failure_reply: bool | UnsetType = UNSET  # a failed turn's reply (docs/agents.md#failure-reply)
    outbox_ids: list[int] | UnsetType = UNSET  # all of them, when there are several


class DraftMeta(_Host, tag="draft", frozen=True):
    """Prose that was not sent (`assistant`), and why (docs/agents.md#drafts)."""

    turn_id: int | None = None
    reason: str | None = None
    conversation_id: str | UnsetType = UNSET


class ToolCallMeta(_Host, tag="tool-call", kw_only=True, frozen=True):
    """One tool call the model made (`assistant`), with its arguments, so the context replays it exactly."""

    turn_id: int | None = None
    tool: str
    tool_call_id: str
    arguments: dict[str, Any] = {}
    conversation_id: str | UnsetType = UNSET


class ToolResultMeta(_Host, tag="tool-result", kw_only=True, frozen=True):
    """What a tool answered (`tool`)."""

    turn_id: int | None = None
    tool: str | None = None
    tool_call_id: str
    is_error: bool = False
    conversation_id: str | UnsetType = UNSET


class Notice(_Host, frozen=True):
    """A host notice for its agent (`user`, `system: true`); the context shows its text after "[host] ".

    `system` is what tells a host notice from anything else: only a row with it true is one.
    """

    system: bool = False


class SourceHeaderNotice(Notice, tag=SOURCE_HEADER_NOTICE_KIND, frozen=True):
    """The one-time statement of the source rule (docs/provenance.md §8)."""

    conversation_id: str | UnsetType = UNSET


class DraftsNotice(Notice, tag="drafts", frozen=True):
    """After a turn's drafts: what was not sent and why (docs/agents.md#drafts)."""

    turn_id: int | None = None
    conversation_id: str | UnsetType = UNSET


class FailedReplyNotice(Notice, tag="failed-reply", frozen=True):
    """A publish that failed for good (docs/agents.md#outbox); its conversation is written even when null."""

    outbox_id: int | None = None
    turn_id: int | None = None
    reason: str | None = None
    destination: Destination | None = None
    conversation_id: str | None = None


class TurnFailedNotice(Notice, tag="turn-failed", frozen=True):
    """The agent's last turn failed, and why (docs/agents.md#turns)."""

    reason: str | None = None
    conversation_id: str | UnsetType = UNSET


class PeerFrom(msgspec.Struct, frozen=True, kw_only=True, rename={"sender": "from"}):
    """`metadata.peer`: who sent a peer message and what they are to its target (docs/peers.md)."""

    sender: str | None = None
    relationship: str | None = None


class PeerMeta(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A peer message delivered as its target's row (`user`); no `turnId`: delivered between turns."""

    peer: PeerFrom
    dispatch: str | None = None
    peer_message_id: int | UnsetType = UNSET  # its queue entry (store/peers.py)
    turn_id: int | UnsetType = UNSET  # the turn it was delivered into, at a tool boundary
    conversation_id: str | UnsetType = UNSET

    @property
    def between_turns(self) -> bool:
        """Delivered between turns: it wakes its target (mcplhost/agents/wakes/rules.py)."""
        return self.turn_id is UNSET


#: The notice kinds, each its own Struct.
NoticeRow = SourceHeaderNotice | DraftsNotice | FailedReplyNotice | TurnFailedNotice
_Kinded = SpeechMeta | DraftMeta | ToolCallMeta | ToolResultMeta | NoticeRow
HostRow = _Kinded | PeerMeta

#: The kinds a host row has, by the tag its metadata carries.
HOST_KINDS: dict[str, type[_Kinded]] = {cls.__struct_config__.tag: cls for cls in get_args(_Kinded)}
#: The notice kinds the host writes (docs/agents.md#turns).
NOTICE_KINDS = frozenset(kind for kind, cls in HOST_KINDS.items() if issubclass(cls, Notice))


# --------------------------------------------------------------------------- reading


def item_meta(metadata: Any) -> ItemMeta:
    """The host-written keys of a row's metadata (each a default where absent or malformed)."""
    return _lenient(metadata, ItemMeta) or _NO_META


def host_row(metadata: Any) -> HostRow | None:
    """What a row's metadata says it is: a host row kind (by `kind`), a peer message (by `peer`), or None."""
    if not isinstance(metadata, dict):
        return None
    kind = HOST_KINDS.get(metadata["kind"]) if isinstance(metadata.get("kind"), str) else None
    row = _lenient(metadata, kind) if kind is not None else None
    if row is None and "peer" in metadata:
        return _lenient(metadata, PeerMeta)
    return row


_NO_META = ItemMeta()


@functools.cache
def _fields(cls: type[msgspec.Struct]) -> tuple[msgspec.structs.FieldInfo, ...]:
    return msgspec.structs.fields(cls)


def _lenient(obj: Any, cls: type[S]) -> S | None:
    """`obj` as `cls`; a member of the wrong type reads as absent; None when `obj` is no such object at all."""
    if not isinstance(obj, dict):
        return None
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError:
        pass
    config = cls.__struct_config__
    if config.tag_field is not None and obj.get(config.tag_field) != config.tag:
        return None
    kept = {}
    for field in _fields(cls):
        if field.encode_name in obj:
            found, value = _member(obj[field.encode_name], field.type)
            if found:
                kept[field.name] = value
    try:
        return cls(**kept)
    except TypeError:  # a member its kind cannot do without is missing or malformed
        return None


def _member(value: Any, type_: Any) -> tuple[bool, Any]:
    """(True, `value` as `type_`), a Struct read leniently where it is one and a list of its members that are
    (tags among other values keep the tags); (False, None) when it is neither."""
    try:
        return True, msgspec.convert(value, type_)
    except msgspec.ValidationError:
        pass
    choices = get_args(type_) if isinstance(type_, UnionType) else (type_,)
    if isinstance(value, list):
        for choice in choices:
            if get_origin(choice) in (list, tuple):
                element = get_args(choice)[0]
                kept = [found for ok, found in (_member(v, element) for v in value) if ok]
                return True, msgspec.convert(kept, choice)
    for choice in choices:
        if isinstance(choice, type) and issubclass(choice, msgspec.Struct):
            found = _lenient(value, choice)
            if found is not None:
                return True, found
    return False, None


# --------------------------------------------------------------------------- writing


def row_metadata(row: HostRow) -> JsonObject:
    """The metadata dict a host row is stored as: its members in their Struct's order, UNSET ones left out."""
    metadata: dict[str, Any] = msgspec.to_builtins(row)
    if not isinstance(row, Notice):
        return metadata
    # A notice's own members come first, then `kind` and `system`, then its conversation, as notices were
    # always written.
    last = ("kind", "system", "conversationId")
    ordered = {key: value for key, value in metadata.items() if key not in last}
    ordered.update((key, metadata[key]) for key in last if key in metadata)
    return ordered
