"""Fail-closed speech routing (docs/agents.md#routing), as pure functions over the wake's frozen sources.

Nothing here guesses: prose goes to the one conversation the wake shares,
or to a channel a `>>> DEST` pin names, and only when that channel is
permitted now; everything else becomes a draft segment with its reason.

Decisions of our own, kept here so they have one home:

- The channels an agent may name are the ones it hears (`hears`, matched as
  wake.py matches it); a channel it does not hear is `unknown` to it, so
  refusals never reveal channels outside its world.
- `connector/channel-id` is tried first, exactly; then a bare value must be
  the id or the label of exactly one channel (an id on one channel and the
  same label on another is ambiguous too).
- A `>>>` line whose DEST names no registered channel is ordinary text (on
  Discord `>>> ` opens a block quote); one whose DEST names several
  (ambiguous) or a channel not permitted is still a pin, and what follows it
  is a draft with that reason: it was meant for somewhere, never a guess.
  DEST may be written as a JSON string literal (as notices quote ids).
- A pin names a channel, not a thread: pinned text goes to the channel itself.
- No double send applies to text routed by default; an explicit pin to the
  same conversation is the model's own choice.
- The default destination is checked like any other: a connector that lost
  `channels.publish` or the channel (a restart) turns it into a draft.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Literal

import msgspec

from mcplhost.protocol.channels import Channel, permitted
from mcplhost.protocol.ports import ChannelListing, ChannelPatterns, PublishCheck
from mcplhost.store.rows import ChannelSource, Destination, Source  # Destination: a speech row's, re-exported

__all__ = [
    "ALREADY_PUBLISHED",
    "MAX_CANDIDATES",
    "PIN_MARK",
    "PUBLISH",
    "REFUSALS",
    "Route",
    "ChannelView",
    "Destination",
    "Refused",
    "Segment",
    "Undecided",
    "channel_views",
    "default_destination",
    "permit",
    "publish_refusal",
    "resolve",
    "route_after",
    "route_prose",
]

PUBLISH = "channels.publish"
#: A prose line starting with this (then whitespace and DEST) is a pin.
PIN_MARK = ">>>"
Refusal = Literal["unknown", "ambiguous", "inbound_only", "not_permitted", "no_publish"]
REFUSALS: tuple[str, ...] = ("unknown", "ambiguous", "inbound_only", "not_permitted", "no_publish")
#: Why a closing segment is a draft although its destination is permitted.
ALREADY_PUBLISHED = "already_published"
#: Conversations an undecided wake lists for the notice (a wake can hold hundreds).
MAX_CANDIDATES = 8

# Why a wake has no default destination.
OVERFLOW = "overflow"
NO_WAKE = "no_wake"
UNSCOPED = "unscoped"
SEVERAL = "several_conversations"


class Undecided(msgspec.Struct, frozen=True, kw_only=True):
    """A wake with no single conversation; `candidates` are its conversations (at most MAX_CANDIDATES)."""

    reason: str
    candidates: tuple[Destination, ...] = ()


class Refused(msgspec.Struct, frozen=True, kw_only=True):
    """A destination that cannot be used; `reason` is one of REFUSALS, `target` the one channel named, if one."""

    reason: str
    target: Destination | None = None


class ChannelView(msgspec.Struct, frozen=True, kw_only=True):
    """One registered channel as the router sees it; `refusal` says why it is not `publishable`."""

    server_id: str
    channel_id: str
    label: str | None
    direction: str  # "inbound" | "outbound" | "bidirectional"
    publishable: bool
    refusal: str | None = None

    @property
    def qualified(self) -> str:
        return f"{self.server_id}/{self.channel_id}"


class Segment(msgspec.Struct, frozen=True, kw_only=True):
    """A run of prose and where it goes; `destination` None is a draft, with `reason`.

    `target` is where a draft would have gone (a refused pin, a double send);
    `candidates` the conversations of an undecided wake: both feed the notice.
    """

    text: str
    destination: Destination | None
    reason: str | None = None
    target: Destination | None = None
    candidates: tuple[Destination, ...] = ()


#: Where prose goes next: a permitted destination, a refusal (its text becomes drafts), or an undecided wake.
Route = Destination | Refused | Undecided


# --------------------------------------------------------------------------- channels


def _hears_channel(hears: Sequence[str] | None, server_id: str, channel_id: str) -> bool:
    """wake.py's `hears` for a channel: `NAME` hears all of NAME, `NAME/GLOB` the ids GLOB matches."""
    if hears is None:
        return True
    for entry in hears:
        name, slash, glob = entry.partition("/")
        if name == server_id and (not slash or fnmatchcase(channel_id, glob)):
            return True
    return False


def _refusal(direction: str, channel_allowed: bool, grant: frozenset[str]) -> str | None:
    if direction == "inbound":
        return "inbound_only"
    if not channel_allowed:
        return "not_permitted"
    if PUBLISH not in grant:
        return "no_publish"
    return None


def _channel_refusal(spec: ChannelPatterns, channel: Channel, grant: frozenset[str]) -> str | None:
    """Why a connector (its `spec`'s patterns) cannot publish to its registered `channel` now, or None: it can."""
    return _refusal(channel.direction, permitted(channel.id, spec.channels), grant)


def publish_refusal(handle: PublishCheck, channel_id: str) -> str | None:
    """Why the connector cannot publish to `channel_id` now (`unknown`: not registered), or None.

    The rule `channel_views` applies, for one channel and whoever hears it:
    the outbox sender asks it before every try (a grant can narrow, a
    channel go away, between the queueing and the send).
    """
    channel = handle.channel(channel_id)
    if channel is None:
        return "unknown"
    return _channel_refusal(handle.spec, channel, frozenset(handle.grant))


def channel_views(handles: Mapping[str, ChannelListing] | Iterable[ChannelListing],
                  hears: Sequence[str] | None) -> list[ChannelView]:
    """The channels the agent hears, from each handle's registered channels and grant, as they are now."""
    views: list[ChannelView] = []
    for handle in handles.values() if isinstance(handles, Mapping) else handles:
        grant = frozenset(handle.grant)
        for channel in handle.channels():
            if not _hears_channel(hears, handle.name, channel.id):
                continue
            refusal = _channel_refusal(handle.spec, channel, grant)
            views.append(ChannelView(server_id=handle.name, channel_id=channel.id, label=channel.label,
                                     direction=channel.direction, publishable=refusal is None, refusal=refusal))
    return views


def elsewhere_view(default: Route, views: Sequence[ChannelView], hears: Sequence[str] | None,
                   elsewhere: Callable[[str], bool]) -> list[ChannelView]:
    """The wake's own conversation as a view, when its connector runs on another host sharing the store.

    This host has none of that connector's registrations, so the channel is taken as publishable here
    and its owner checks grant, registration and direction at send time (speech/outbox.py), failing
    the row with a notice if it may not (docs/operations.md#several-hosts-on-one-store). Only the wake's
    conversation, and only if the agent hears it: a pin cannot name another host's other channels.
    """
    if not isinstance(default, Destination) or not elsewhere(default.server_id) \
            or not _hears_channel(hears, default.server_id, default.channel_id):
        return []
    if any(v.server_id == default.server_id and v.channel_id == default.channel_id for v in views):
        return []
    return [ChannelView(server_id=default.server_id, channel_id=default.channel_id, label=None,
                        direction="bidirectional", publishable=True)]


# --------------------------------------------------------------------------- destinations


def default_destination(sources: Sequence[Source | None], *, overflow: bool) -> Destination | Undecided:
    """The one conversation every waking item shares (its frozen `metadata.source`), or why there is none.

    A push naming a channel is a `channel` source, so it counts as that
    channel; a correction's source already carries its inherited thread.
    """
    conversations: list[Destination] = []
    unscoped = False
    for source in sources:
        if not isinstance(source, ChannelSource) or source.server_id is None or source.channel_id is None:
            unscoped = True
            continue
        here = Destination(server_id=source.server_id, channel_id=source.channel_id, thread_id=source.thread_id)
        if here not in conversations:
            conversations.append(here)
    candidates = tuple(conversations[:MAX_CANDIDATES])
    if overflow:
        return Undecided(reason=OVERFLOW, candidates=candidates)
    if not sources:
        return Undecided(reason=NO_WAKE)
    if not conversations:
        return Undecided(reason=UNSCOPED)
    if len(conversations) > 1 or unscoped:
        return Undecided(reason=SEVERAL, candidates=candidates)
    return conversations[0]


def _named(dest: str, views: Sequence[ChannelView]) -> list[ChannelView]:
    """The views `dest` names: `connector/channel-id` exactly, else every channel with that id or label."""
    exact = [view for view in views if view.qualified == dest]
    if exact:
        return exact[:1]
    return [view for view in views if dest in (view.channel_id, view.label)]


def resolve(dest: str, views: Sequence[ChannelView], *, thread: str | None = None) -> Destination | Refused:
    """The channel `dest` names, if it names exactly one and that one is permitted now; else why not."""
    named = _named(dest, views)
    if not named:
        return Refused(reason="unknown")
    if len(named) > 1:
        return Refused(reason="ambiguous")
    view = named[0]
    destination = Destination(server_id=view.server_id, channel_id=view.channel_id, thread_id=thread)
    return destination if view.refusal is None else Refused(reason=view.refusal, target=destination)


def permit(destination: Destination, views: Sequence[ChannelView]) -> Destination | Refused:
    """`destination` itself when its channel is registered, heard and permitted now; else why not."""
    for view in views:
        if view.server_id == destination.server_id and view.channel_id == destination.channel_id:
            return destination if view.refusal is None else Refused(reason=view.refusal, target=destination)
    return Refused(reason="unknown", target=destination)


# --------------------------------------------------------------------------- prose


def _pin_value(line: str) -> str | None:
    """DEST of a `>>> DEST` line (a JSON string literal decoded), or None when the line is no pin shape."""
    stripped = line.strip()
    if not stripped.startswith(PIN_MARK):
        return None
    rest = stripped[len(PIN_MARK):]
    if not rest[:1].isspace():
        return None
    value = rest.strip()
    if value.startswith('"'):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        return decoded if isinstance(decoded, str) and decoded else value
    return value or None


def _pin(line: str, views: Sequence[ChannelView]) -> Destination | Refused | None:
    """What a pin line routes to (a refusal naming registered channels included); None: ordinary text."""
    value = _pin_value(line)
    if value is None:
        return None
    resolved = resolve(value, views)
    if isinstance(resolved, Refused) and resolved.reason == "unknown":
        return None
    return resolved


def _segment(text: str, route: Route, default: Route, *, pinned: bool, published_default: bool) -> Segment | None:
    text = text.strip("\r\n")
    if not text.strip():
        return None
    if isinstance(route, Undecided):
        return Segment(text=text, destination=None, reason=route.reason, candidates=route.candidates)
    if isinstance(route, Refused):
        return Segment(text=text, destination=None, reason=route.reason, target=route.target)
    if not pinned and published_default and route == default:
        return Segment(text=text, destination=None, reason=ALREADY_PUBLISHED, target=route)
    return Segment(text=text, destination=route)


def _routes(prose: str, default: Route, views: Sequence[ChannelView]) -> list[tuple[Route, bool, list[str]]]:
    """The prose's runs of lines, each with the route in force and whether a pin set it."""
    route = permit(default, views) if isinstance(default, Destination) else default
    runs: list[tuple[Route, bool, list[str]]] = [(route, False, [])]
    for line in prose.splitlines(keepends=True):
        pin = _pin(line, views)
        if pin is None:
            runs[-1][2].append(line)
        else:
            runs.append((pin, True, []))
    return runs


def route_prose(prose: str, default: Route, views: Sequence[ChannelView], *,
                published_default: bool) -> list[Segment]:
    """Split a turn's prose into segments at its pins and route each (docs/agents.md#pins); empty prose: none.

    `default` is the wake's default destination (or Undecided), or the
    route a pin in the turn's earlier prose left in force (`route_after`).
    `published_default`: the turn already sent to its default destination
    through `channel_publish`, so text routed there by default is a draft.
    """
    segments = (_segment("".join(lines), route, default, pinned=pinned, published_default=published_default)
                for route, pinned, lines in _routes(prose, default, views))
    return [segment for segment in segments if segment is not None]


def route_after(prose: str, current: Route, views: Sequence[ChannelView]) -> Route:
    """The route in force after `prose`: its last pin (refused or not), else `current`, for the turn's later prose."""
    *_, (route, pinned, _lines) = _routes(prose, current, views)
    return route if pinned else current
