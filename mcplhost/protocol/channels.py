"""The channels one connection registered, judged one descriptor at a time (SPEC §14).

Each descriptor in a `channels/register` or `channels/changed` batch is
authorized on its own: well formed, unique in its batch, and inside the
operator's narrowing patterns for this connector. One allowed descriptor never
carries a forbidden one in with it; the answer is itemized.

Narrowing patterns (our choice): shell-style globs matched against the
whole channel id with `fnmatch.fnmatchcase`: `*` matches any run of
characters (`:` and `/` included), `?` one character, `[...]` a set. So
`discord:g1:*` admits every channel id starting with `discord:g1:`. No
patterns configured means any id.

Re-registering an id that is already registered replaces its descriptor
(a connector that reconnected to its platform may announce its channels
again); the label at receipt is always the latest registered one.

The registry is keyed by connector-chosen ids, so it is bounded: once it
holds `MAX_CHANNELS` channels, a descriptor for a new id is refused
(`channel_limit`) until some are removed; replacing a registered id still
works. Each descriptor is bounded too: its id, type and label at
`MAX_CHANNEL_TEXT_CHARS` characters, its address and metadata (as compact
JSON) at `MAX_CHANNEL_ADDRESS_BYTES` and `MAX_CHANNEL_METADATA_BYTES`; a larger
one is refused whole (`too_large`), never cut, so what is registered is
exactly what the connector sent (docs/connectors.md §15).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Any

import msgspec

from mcplhost.jsonobject import JsonObject

DIRECTIONS = ("inbound", "outbound", "bidirectional")
#: Channels one connection may have registered at once (a real connector has hundreds, not thousands).
MAX_CHANNELS = 10_000
#: The itemized reason for a descriptor refused because the registry is full.
CHANNEL_LIMIT = "channel_limit"
#: A channel's id, type and label: characters each (they reach logs and prompts).
MAX_CHANNEL_TEXT_CHARS = 256
#: A channel's `address` as compact JSON, in bytes.
MAX_CHANNEL_ADDRESS_BYTES = 1024
#: A channel's `metadata` as compact JSON, in bytes. With the channel count, this bounds a registry's memory.
MAX_CHANNEL_METADATA_BYTES = 4096
#: The itemized reason for a descriptor over one of these bounds.
TOO_LARGE = "too_large"


class Channel(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    type: str | None = None
    label: str | None = None
    direction: str = "bidirectional"
    address: Any = None
    metadata: Any = None
    initiallyOpen: bool | None = None

    def descriptor(self) -> JsonObject:
        """The descriptor as the connector registered it (for channels/list)."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}

    @property
    def receives(self) -> bool:
        """Whether messages may come in from this channel (not outbound-only)."""
        return self.direction != "outbound"


def parse_descriptor(raw: Any) -> Channel | str:
    """A Channel, or the reason the descriptor is malformed."""
    if not isinstance(raw, dict):
        return "invalid_descriptor"
    try:
        channel = msgspec.convert(raw, Channel)
    except msgspec.ValidationError:
        return "invalid_descriptor"
    if not channel.id:
        return "invalid_descriptor"
    if channel.direction not in DIRECTIONS:
        return "invalid_descriptor"
    if too_large(channel):
        return TOO_LARGE
    return channel


def too_large(channel: Channel) -> bool:
    """Whether a descriptor is over one of the per-channel bounds."""
    if any(text is not None and len(text) > MAX_CHANNEL_TEXT_CHARS for text in (channel.id, channel.type, channel.label)):
        return True
    return (_encoded_size(channel.address) > MAX_CHANNEL_ADDRESS_BYTES
            or _encoded_size(channel.metadata) > MAX_CHANNEL_METADATA_BYTES)


def _encoded_size(value: Any) -> int:
    if value is None:
        return 0
    try:
        return len(msgspec.json.encode(value))
    except (TypeError, ValueError, OverflowError):
        return MAX_CHANNEL_METADATA_BYTES + MAX_CHANNEL_ADDRESS_BYTES + 1  # cannot be stored as JSON: too large


def permitted(channel_id: str, patterns: Sequence[str] | None) -> bool:
    return patterns is None or any(fnmatchcase(channel_id, p) for p in patterns)


def _result(raw: Any, accepted: bool, reason: str | None = None) -> JsonObject:
    ident = raw.get("id") if isinstance(raw, dict) else None
    entry: dict[str, Any] = {"id": ident if isinstance(ident, str) else None, "accepted": accepted}
    if reason is not None:
        entry["reason"] = reason
    return entry


class ChannelRegistry:
    def __init__(self, patterns: Sequence[str] | None = None, *, limit: int = MAX_CHANNELS,
                 on_change: Callable[[], None] | None = None) -> None:
        self.patterns = list(patterns) if patterns is not None else None
        self.limit = limit
        self._channels: dict[str, Channel] = {}
        #: Called after the registered channels changed (whoever waits for a channel looks again).
        self._on_change = on_change

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def get(self, channel_id: str) -> Channel | None:
        return self._channels.get(channel_id)

    def channels(self) -> list[Channel]:
        return list(self._channels.values())

    def clear(self) -> None:
        if self._channels:
            self._channels.clear()
            self._changed()

    def add(self, descriptors: Iterable[Any], *, must_exist: bool = False) -> tuple[list[dict[str, Any]], list[Channel]]:
        """Judge and apply descriptors; return itemized results and the accepted channels.

        `must_exist` is for `updated`: an id that is not registered is refused.
        """
        results: list[dict[str, Any]] = []
        accepted: list[Channel] = []
        seen: set[str] = set()
        for raw in descriptors:
            channel = parse_descriptor(raw)
            if isinstance(channel, str):
                results.append(_result(raw, False, channel))
            elif channel.id in seen:
                results.append(_result(raw, False, "duplicate_id"))
            elif not permitted(channel.id, self.patterns):
                results.append(_result(raw, False, "channel_not_permitted"))
            elif must_exist and channel.id not in self._channels:
                results.append(_result(raw, False, "unknown_channel"))
            elif channel.id not in self._channels and len(self._channels) >= self.limit:
                results.append(_result(raw, False, CHANNEL_LIMIT))
            else:
                seen.add(channel.id)
                self._channels[channel.id] = channel
                accepted.append(channel)
                results.append(_result(raw, True))
        if accepted:
            self._changed()
        return results, accepted

    def remove(self, ids: Iterable[Any]) -> list[dict[str, Any]]:
        """Removals only narrow, so they always succeed; echo each."""
        results = []
        removed = False
        for ident in ids:
            if isinstance(ident, str):
                removed = self._channels.pop(ident, None) is not None or removed
                results.append({"id": ident, "accepted": True})
            else:
                results.append({"id": None, "accepted": False, "reason": "invalid_descriptor"})
        if removed:
            self._changed()
        return results
