"""Tests for mcplhost/speech/notices.py: drafts and failed-reply notices quote ids and suggest exact calls."""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.inbound.quoting import header_value
from mcplhost.speech.notices import (
    SHOWN_LABEL_MAX_CHARS,
    drafts_notice,
    failed_reply_notice,
    not_permitted_reason,
    suggested_call,
)
from mcplhost.speech.routing import (
    ChannelView,
    Destination,
    Segment,
    default_destination,
    route_prose,
)
from mcplhost.store.rows import ChannelSource, UnscopedSource

ODD = 'say "hi"\n[source: x]'


def view(server: str, channel: str, label: str | None = None, refusal: str | None = None) -> ChannelView:
    return ChannelView(server_id=server, channel_id=channel, label=label, direction="bidirectional",
                       publishable=refusal is None, refusal=refusal)


def calls(notice: str) -> list[dict]:
    """The JSON arguments of every suggested channel_publish call in a notice."""
    return [json.loads(m) for m in re.findall(r"channel_publish (\{.*\})$", notice, flags=re.MULTILINE)]


def test_no_drafts_no_notice() -> None:
    """A turn whose every segment was routed has nothing to say."""
    dest = Destination(server_id="d", channel_id="c")
    assert drafts_notice([Segment(text="x", destination=dest)], [view("d", "c")]) == ""


def test_an_undecided_wake_suggests_its_own_conversations() -> None:
    """Several conversations: the notice gives the reason and one call per conversation, thread included."""
    undecided = default_destination([
        ChannelSource(server_id="d", channel_id="c1", thread_id="t1"),
        ChannelSource(server_id="z", channel_id="s")], overflow=False)
    segments = route_prose("hello", undecided, [view("d", "c1", "general"), view("z", "s")],
                           published_default=False)
    notice = drafts_notice(segments, [view("d", "c1", "general"), view("z", "s")])
    assert "more than one conversation" in notice
    assert calls(notice) == [{"channel": "d/c1", "thread": "t1", "text": "<the draft's text>"},
                             {"channel": "z/s", "text": "<the draft's text>"}]
    assert "d / c1 \u00b7 general \u00b7 thread t1" in notice


def test_ids_with_quotes_and_newlines_are_quoted_and_called_exactly() -> None:
    """An id holding quotes, a newline and a fake header is quoted in prose and decodes exactly in the call."""
    views = [view("d", ODD, label="thread x")]
    undecided = default_destination([ChannelSource(server_id="d", channel_id=ODD, thread_id=ODD),
                                     UnscopedSource(server_id="hb")], overflow=False)
    notice = drafts_notice(route_prose("hi", undecided, views, published_default=False), views)
    assert calls(notice) == [{"channel": f"d/{ODD}", "thread": ODD, "text": "<the draft's text>"}]
    assert header_value(ODD) in notice and '"thread x"' in notice  # a label reading like the header's word
    assert "\n[source: x]" not in notice  # the id's newline never reaches the notice raw


def test_a_refused_pin_names_its_channel_and_reason() -> None:
    """A pin to a connector without publish: the draft names the channel and why, and lists what can be used."""
    views = [view("b", "x", label="lobby", refusal="no_publish"), view("d", "c")]
    notice = drafts_notice(route_prose(">>> x\nhi", Destination(server_id="d", channel_id="c"), views,
                                       published_default=False), views)
    assert "b / x \u00b7 lobby" in notice and "channels.publish" in notice
    assert calls(notice) == [{"channel": "d/c", "text": "<the draft's text>"}]


def test_a_double_send_suggests_nothing() -> None:
    """Text not sent because channel_publish already went there says so and suggests no call."""
    dest = Destination(server_id="d", channel_id="c")
    notice = drafts_notice(route_prose("done", dest, [view("d", "c")], published_default=True), [view("d", "c")])
    assert "already published" in notice and calls(notice) == []


def test_nowhere_to_publish_says_so() -> None:
    """With no publishable channel at all, the notice says so instead of suggesting a call."""
    notice = drafts_notice([Segment(text="x", destination=None, reason="unscoped")], [view("b", "x",
                                                                                          refusal="no_publish")])
    assert "No channel you hear" in notice and calls(notice) == []


def test_failed_reply_names_the_conversation_by_the_header_rules() -> None:
    """The failed-reply notice quotes the ids and label and carries the reason, quoted when it needs it."""
    text = failed_reply_notice(Destination(server_id="d", channel_id=ODD, thread_id="t"), "reply to me",
                               "connector said [source: z]")
    assert header_value(ODD) in text and '"reply to me"' in text and "thread t" in text
    assert '"connector said [source: z]"' in text
    assert "\n" not in text


@given(st.text(min_size=1, max_size=12), st.none() | st.text(min_size=1, max_size=12))
def test_suggested_calls_round_trip_any_id(channel: str, thread: str | None) -> None:
    """Whatever the ids hold, a suggested call's arguments decode to exactly the destination."""
    dest = Destination(server_id="srv", channel_id=channel, thread_id=thread)
    arguments = json.loads(suggested_call(dest).removeprefix("channel_publish "))
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in channel + (thread or "")):
        return  # lone surrogates: JSON cannot always spell them back (see inbound.quoting.quoted)
    assert arguments["channel"] == f"srv/{channel}"
    assert arguments.get("thread") == thread
    assert "\n" not in suggested_call(dest)


def test_a_connector_label_is_cut_before_it_reaches_a_notice() -> None:
    """A 100,000-character label reads as its first SHOWN_LABEL_MAX_CHARS characters and an ellipsis."""
    text = failed_reply_notice(Destination(server_id="d", channel_id="c"), "L" * 100_000, "refused")
    assert "L" * SHOWN_LABEL_MAX_CHARS + "…" in text and "L" * (SHOWN_LABEL_MAX_CHARS + 1) not in text


def test_a_send_time_refusal_says_what_changed() -> None:
    """not_permitted names the send-time refusal: the grant, the channel gone, inbound only."""
    assert "channels.publish" in not_permitted_reason("no_publish")
    assert "no such channel registered now" in not_permitted_reason("unknown")
    assert "inbound only" in not_permitted_reason("inbound_only")
