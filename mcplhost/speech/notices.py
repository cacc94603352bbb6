"""The texts of the `drafts` and `failed-reply` notices (docs/agents.md#drafts, docs/agents.md#outbox; docs/connectors.md §13).

Every connector-chosen value (connector name, channel id, label, thread id,
a connector's refusal text) is written by the header's quoting rules
(docs/provenance.md §3: `header_value`, `label_value`), so an id holding a quote,
a newline or a fake `[source: …]` reads as data. The suggested
`channel_publish` calls give every argument as a JSON string literal
(`quoted`), which decodes back to the exact id.
"""

from __future__ import annotations

from collections.abc import Sequence

from mcplhost.inbound.header import SEPARATOR
from mcplhost.inbound.quoting import header_value, label_value, quoted
from mcplhost.speech.budget import DUPLICATE, PUBLISH_CAP
from mcplhost.speech.moderation import MODERATION
from mcplhost.speech.routing import ALREADY_PUBLISHED, ChannelView, Destination, Segment

__all__ = ["MAX_LISTED_CHANNELS", "SHOWN_LABEL_MAX_CHARS", "describe", "drafts_notice", "failed_reply_notice", "not_permitted_reason",
           "shown_label", "suggested_call"]

#: Channels a drafts notice lists when it has no better suggestion (an agent may hear thousands).
MAX_LISTED_CHANNELS = 10
#: Longest channel label shown to a model (a notice, channel_list); the rest is cut with "…".
SHOWN_LABEL_MAX_CHARS = 256
#: Stands for the draft's text in a suggested call: the draft is in the context just above.
TEXT_PLACEHOLDER = "<the draft's text>"

_REASONS = {
    "overflow": "the wake overflowed, so it names no single conversation",
    "no_wake": "no wake names a conversation",
    "unscoped": "the wake's items name no channel",
    "several_conversations": "the wake's items came from more than one conversation",
    "unknown": "no channel you hear has that name",
    "ambiguous": "more than one channel has that name; use connector/channel-id",
    "inbound_only": "the channel is inbound only",
    "not_permitted": "the channel is not permitted for this connector",
    "no_publish": "the connector cannot publish (no channels.publish) now",
    ALREADY_PUBLISHED: "you already published to this conversation with channel_publish this turn",
    MODERATION: "the host's moderation check did not allow it (or could not check it); it was not sent",
    DUPLICATE: "you already published the same text there this turn; it is not sent twice",
    PUBLISH_CAP: "this turn reached its limit of published parts (max_publishes_per_turn)",
}
#: Draft reasons for which suggesting another channel_publish makes no sense (it would be refused again).
_NOT_RESENDABLE = frozenset({ALREADY_PUBLISHED, MODERATION, DUPLICATE, PUBLISH_CAP})


#: At send time a channel no longer registered is gone, not a name the agent got wrong.
_SEND_TIME_REASONS = {**_REASONS, "unknown": "its connector has no such channel registered now"}


def not_permitted_reason(refusal: str) -> str:
    """Why a queued publish was not sent: the send-time check found `refusal` (one of routing.REFUSALS)."""
    return f"it is not permitted now ({_SEND_TIME_REASONS.get(refusal, 'refused')})"


def _reason_text(reason: str | None) -> str:
    if reason is None:
        return "not sent"
    return _REASONS.get(reason) or header_value(reason)


def _label_of(destination: Destination, views: Sequence[ChannelView]) -> str | None:
    for view in views:
        if view.server_id == destination.server_id and view.channel_id == destination.channel_id:
            return view.label
    return None


def shown_label(label: str) -> str:
    """A connector's channel label as a model is shown it: at most SHOWN_LABEL_MAX_CHARS, then "…"."""
    return label if len(label) <= SHOWN_LABEL_MAX_CHARS else label[:SHOWN_LABEL_MAX_CHARS] + "…"


def describe(destination: Destination, label: str | None = None) -> str:
    """A conversation as the header names it: `S / C · L · thread T` (the label cut: `shown_label`)."""
    parts = [f"{header_value(destination.server_id)} / {header_value(destination.channel_id)}"]
    if label:
        parts.append(label_value(shown_label(label)))
    if destination.thread_id:
        parts.append(f"thread {header_value(destination.thread_id)}")
    return SEPARATOR.join(parts)


def suggested_call(destination: Destination) -> str:
    """A `channel_publish` call for `destination`, every argument a JSON string literal."""
    arguments = [f'"channel": {quoted(f"{destination.server_id}/{destination.channel_id}")}']
    if destination.thread_id:
        arguments.append(f'"thread": {quoted(destination.thread_id)}')
    arguments.append(f'"text": {quoted(TEXT_PLACEHOLDER)}')
    return "channel_publish {" + ", ".join(arguments) + "}"


def _suggestions(segment: Segment, views: Sequence[ChannelView]) -> list[Destination]:
    """Where this draft could go: the undecided wake's conversations, or nothing for a refused target."""
    if segment.reason in _NOT_RESENDABLE:
        return []
    return [dest for dest in segment.candidates
            if any(v.publishable and v.server_id == dest.server_id and v.channel_id == dest.channel_id
                   for v in views)]


def drafts_notice(segments: Sequence[Segment], views: Sequence[ChannelView]) -> str:
    """The notice after a turn's drafts: what was not sent and why, and how to send it; "" without drafts."""
    drafts = [segment for segment in segments if segment.destination is None]
    if not drafts:
        return ""
    count = "1 part" if len(drafts) == 1 else f"{len(drafts)} parts"
    lines = [f"{count} of your reply {'was' if len(drafts) == 1 else 'were'} not sent and "
             f"{'is' if len(drafts) == 1 else 'are'} kept as drafts; nothing was sent to a guess."]
    suggested: list[Destination] = []
    for number, segment in enumerate(drafts, 1):
        where = f" for {describe(segment.target, _label_of(segment.target, views))}" if segment.target else ""
        lines.append(f"- draft {number}{where}: {_reason_text(segment.reason)}.")
        suggested.extend(dest for dest in _suggestions(segment, views) if dest not in suggested)
    if not suggested and not all(segment.reason in _NOT_RESENDABLE for segment in drafts):
        suggested = [Destination(server_id=view.server_id, channel_id=view.channel_id)
                     for view in views if view.publishable][:MAX_LISTED_CHANNELS]
    if suggested:
        lines.append("To send a draft, call channel_publish with JSON-string arguments, for example:")
        lines.extend(f"  {describe(dest, _label_of(dest, views))}: {suggested_call(dest)}" for dest in suggested)
    elif not all(segment.reason in _NOT_RESENDABLE for segment in drafts):
        lines.append("No channel you hear can be published to now.")
    return "\n".join(lines)


def failed_reply_notice(destination: Destination, label: str | None, reason: str) -> str:
    """The notice for a publish that failed for good (docs/connectors.md §13): which conversation, and why."""
    return (f"Your reply to {describe(destination, label)} was not delivered and will not be retried: "
            f"{_reason_text(reason)}.")
