"""Tests for mcplhost/speech/routing.py: fail-closed default destinations, resolution, and pins (docs/agents.md#routing)."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.inbound.conversation import conversation_id
from mcplhost.protocol.channels import Channel
from mcplhost.speech.routing import (
    ALREADY_PUBLISHED,
    ChannelView,
    Destination,
    Refused,
    Segment,
    Undecided,
    channel_views,
    default_destination,
    elsewhere_view,
    permit,
    resolve,
    route_after,
    route_prose,
)
from mcplhost.store import rows
from mcplhost.store.rows import Source, item_meta

PUBLISH = frozenset({"channels.register", "channels.incoming", "channels.publish"})


@dataclass
class Spec:
    channels: list[str] | None = None


@dataclass
class Handle:
    """A ChannelListing: its name, patterns, grant and registered channels."""

    name: str
    registered: list[Channel]
    grant: frozenset[str] = PUBLISH
    spec: Spec = field(default_factory=Spec)

    def channels(self) -> list[Channel]:
        return list(self.registered)


def view(server: str, channel: str, label: str | None = None, refusal: str | None = None) -> ChannelView:
    return ChannelView(server_id=server, channel_id=channel, label=label, direction="bidirectional",
                       publishable=refusal is None, refusal=refusal)


def source(server: str, channel: str | None, thread: str | None = None, kind: str = "channel") -> Source | None:
    """A frozen envelope as a waking item's row reads it (store/rows.py)."""
    out = {"kind": kind, "lane": "channels/incoming", "serverId": server, "acceptedAt": 1}
    if channel is not None:
        out["channelId"] = channel
    if thread is not None:
        out["threadId"] = thread
    return item_meta({"source": out}).source


ROOM = Destination(server_id="discord", channel_id="discord:g1:room")
VIEWS = [view("discord", "discord:g1:room", "general"), view("zulip", "stream:ops", "ops")]


# --------------------------------------------------------------------------- Destination


def test_routing_reexports_the_rows_destination() -> None:
    """speech.routing re-exports the store's Destination, the one a speech row's metadata is read as."""
    assert Destination is rows.Destination


def test_destination_conversation_id_is_ingests() -> None:
    """A destination's conversation id is the id channels/incoming items of that thread carry."""
    dest = Destination(server_id="s", channel_id="c", thread_id="t")
    assert dest.conversation_id() == conversation_id("s", "c", "t")


# --------------------------------------------------------------------------- channel_views


def test_channel_views_judges_direction_patterns_and_grant() -> None:
    """Each registered channel says whether it is publishable now, and if not, why."""
    handles = {
        "discord": Handle("discord", [Channel(id="a", label="A"), Channel(id="in", direction="inbound"),
                                      Channel(id="out", direction="outbound")], spec=Spec(channels=["a", "in"])),
        "quiet": Handle("quiet", [Channel(id="q")], grant=frozenset({"channels.register"})),
    }
    views = {(v.server_id, v.channel_id): v for v in channel_views(handles, None)}
    assert views["discord", "a"].publishable and views["discord", "a"].label == "A"
    assert views["discord", "in"].refusal == "inbound_only"
    assert views["discord", "out"].refusal == "not_permitted"  # outside the connector's patterns
    assert views["quiet", "q"].refusal == "no_publish" and not views["quiet", "q"].publishable


def test_channel_views_keep_only_what_the_agent_hears() -> None:
    """`hears` filters as the wake rules do: a whole connector, or its channels matching a glob."""
    handles = [Handle("d", [Channel(id="g1:a"), Channel(id="g2:b")]), Handle("z", [Channel(id="s")])]
    heard = {(v.server_id, v.channel_id) for v in channel_views(handles, ["d/g1:*"])}
    assert heard == {("d", "g1:a")}
    assert len(channel_views(handles, ["z"])) == 1
    assert channel_views(handles, []) == []


# --------------------------------------------------------------------------- default_destination


def test_default_follows_the_waking_conversation_thread_included() -> None:
    """Items of one thread give that thread as the destination."""
    sources = [source("discord", "discord:g1:room", "t1"), source("discord", "discord:g1:room", "t1")]
    assert default_destination(sources, overflow=False) == Destination(
        server_id="discord", channel_id="discord:g1:room", thread_id="t1")


def test_default_follows_a_corrections_inherited_thread() -> None:
    """A correction's frozen source carries its original's thread, so it joins that thread's conversation."""
    original = source("discord", "c", "t9")
    correction = msgspec.structs.replace(original, message_id="m1")  # the thread was inherited at ingest
    assert default_destination([original, correction], overflow=False) == Destination(
        server_id="discord", channel_id="c", thread_id="t9")


def test_a_push_naming_a_channel_counts_as_that_channel() -> None:
    """A channel-scoped push and a message of that channel share one conversation."""
    push = msgspec.structs.replace(source("discord", "c"), lane="push/event")
    assert default_destination([push, source("discord", "c")], overflow=False) == Destination(
        server_id="discord", channel_id="c")


def test_several_conversations_are_undecided() -> None:
    """Two threads of one channel are two conversations: undecided, with both as candidates."""
    decided = default_destination([source("d", "c", "t1"), source("d", "c")], overflow=False)
    assert isinstance(decided, Undecided) and decided.reason == "several_conversations"
    assert len(decided.candidates) == 2


def test_unscoped_overflow_and_no_wake_are_undecided() -> None:
    """Only unscoped pushes, an overflowed wake, or no items at all never name a destination."""
    unscoped = source("hb", None, kind="unscoped")
    assert default_destination([unscoped], overflow=False) == Undecided(reason="unscoped")
    assert default_destination([source("d", "c")], overflow=True).reason == "overflow"
    assert default_destination([], overflow=False).reason == "no_wake"
    mixed = default_destination([unscoped, source("d", "c")], overflow=False)
    assert isinstance(mixed, Undecided) and mixed.reason == "several_conversations"
    assert default_destination(["junk"], overflow=False) == Undecided(reason="unscoped")  # type: ignore[list-item]


# --------------------------------------------------------------------------- resolve


def test_resolve_qualified_bare_id_and_label() -> None:
    """`connector/channel-id`, a unique bare id and a unique label all resolve to that channel."""
    for name in ("discord/discord:g1:room", "discord:g1:room", "general"):
        assert resolve(name, VIEWS) == ROOM
    assert resolve("ops", VIEWS, thread="topic") == Destination(server_id="zulip", channel_id="stream:ops",
                                                                thread_id="topic")


def test_same_channel_id_on_two_connectors_is_ambiguous() -> None:
    """A bare id registered by two connectors is ambiguous, never a guess; the qualified form still works."""
    views = [view("a", "general"), view("b", "general")]
    assert resolve("general", views) == Refused(reason="ambiguous")
    assert resolve("b/general", views) == Destination(server_id="b", channel_id="general")


def test_an_id_on_one_channel_and_a_label_on_another_is_ambiguous() -> None:
    """A value naming two channels (one by id, one by label) resolves to neither."""
    views = [view("a", "lobby"), view("b", "c2", label="lobby")]
    assert resolve("lobby", views) == Refused(reason="ambiguous")


def test_resolve_refusals() -> None:
    """Unknown names, inbound-only channels, channels outside the patterns and connectors without publish."""
    views = [view("a", "in", refusal="inbound_only"), view("a", "np", refusal="not_permitted"),
             view("b", "x", refusal="no_publish")]
    assert resolve("nowhere", views) == Refused(reason="unknown")
    assert resolve("a/in", views) == Refused(reason="inbound_only", target=Destination(server_id="a", channel_id="in"))
    assert resolve("np", views).reason == "not_permitted"
    assert resolve("x", views, thread="t") == Refused(
        reason="no_publish", target=Destination(server_id="b", channel_id="x", thread_id="t"))
    assert permit(Destination(server_id="b", channel_id="x"), views).reason == "no_publish"
    assert permit(Destination(server_id="b", channel_id="gone"), views).reason == "unknown"


names = st.text(alphabet="ab/\"\n :", min_size=1, max_size=4)


@given(st.lists(st.tuples(st.sampled_from(["s1", "s2"]), names, st.none() | names), max_size=6), names)
def test_resolve_never_guesses(channels: list[tuple[str, str, str | None]], dest: str) -> None:
    """Whatever is registered, a Destination comes back only for the one channel the value names exactly."""
    views = [view(s, c, label) for s, c, label in {(s, c): (s, c, label) for s, c, label in channels}.values()]
    resolved = resolve(dest, views)
    qualified = [v for v in views if v.qualified == dest]
    bare = [v for v in views if dest in (v.channel_id, v.label)]
    if isinstance(resolved, Destination):
        chosen = qualified[0] if qualified else bare[0]
        assert (resolved.server_id, resolved.channel_id) == (chosen.server_id, chosen.channel_id)
        assert qualified or len(bare) == 1
    else:
        assert not qualified and len(bare) != 1
        assert resolved.reason == ("unknown" if not bare else "ambiguous")


# --------------------------------------------------------------------------- route_prose


def test_prose_goes_to_the_default_destination() -> None:
    """Prose with no pin is one segment to the default destination."""
    assert route_prose("hello\nthere\n", ROOM, VIEWS, published_default=False) == [
        Segment(text="hello\nthere", destination=ROOM)]


def test_empty_prose_publishes_nothing() -> None:
    """Empty or blank prose gives no segment at all."""
    assert route_prose("", ROOM, VIEWS, published_default=False) == []
    assert route_prose("\n  \n", ROOM, VIEWS, published_default=False) == []


def test_undecided_prose_is_a_draft_with_the_candidates() -> None:
    """Several conversations: the prose is a draft with the reason and the wake's conversations."""
    undecided = default_destination([source("discord", "discord:g1:room", "t1"), source("zulip", "stream:ops")],
                                    overflow=False)
    [segment] = route_prose("hi", undecided, VIEWS, published_default=False)
    assert segment.destination is None and segment.reason == "several_conversations"
    assert len(segment.candidates) == 2


def test_pins_route_what_follows_and_a_later_pin_wins() -> None:
    """Each pin sends the text after it to its channel; the pin lines themselves are not published."""
    prose = "for the room\n>>> ops\nfor ops\n>>> zulip/stream:ops\n>>> discord/discord:g1:room\nback\n"
    segments = route_prose(prose, ROOM, VIEWS, published_default=False)
    ops = Destination(server_id="zulip", channel_id="stream:ops")
    assert segments == [Segment(text="for the room", destination=ROOM), Segment(text="for ops", destination=ops),
                        Segment(text="back", destination=ROOM)]
    assert all(">>>" not in s.text for s in segments)


def test_a_pin_to_nothing_registered_is_ordinary_text() -> None:
    """`>>> ` naming no channel is a block quote, not a pin, and stays in the text."""
    [segment] = route_prose(">>> a quoted thought\nreply", ROOM, VIEWS, published_default=False)
    assert segment == Segment(text=">>> a quoted thought\nreply", destination=ROOM)


def test_a_pin_written_as_a_json_string_resolves() -> None:
    """A pin may quote its DEST as the notices do, so odd ids can be pinned."""
    views = [view("d", 'we"ird\nid')]
    [segment] = route_prose('>>> "we\\"ird\\nid"\nhi', ROOM, views, published_default=False)
    assert segment.destination == Destination(server_id="d", channel_id='we"ird\nid')


def test_pins_to_refused_or_ambiguous_channels_make_drafts() -> None:
    """A pin to an inbound-only channel, a connector without publish or an ambiguous name drafts its text."""
    views = [view("a", "in", refusal="inbound_only"), view("b", "x", refusal="no_publish"),
             view("c", "dup"), view("d", "dup"), *VIEWS]
    prose = ">>> in\none\n>>> x\ntwo\n>>> dup\nthree\n>>> general\nfour"
    segments = route_prose(prose, ROOM, views, published_default=False)
    assert [(s.text, s.reason) for s in segments] == [("one", "inbound_only"), ("two", "no_publish"),
                                                      ("three", "ambiguous"), ("four", None)]
    assert segments[0].target == Destination(server_id="a", channel_id="in")
    assert segments[2].target is None


def test_a_default_destination_no_longer_permitted_is_a_draft() -> None:
    """A connector that lost publish (or the channel) since the wake gets no text: it is a draft."""
    [segment] = route_prose("hi", ROOM, [view("discord", "discord:g1:room", refusal="no_publish")],
                            published_default=False)
    assert segment.destination is None and segment.reason == "no_publish" and segment.target == ROOM
    [gone] = route_prose("hi", ROOM, [], published_default=False)
    assert gone.reason == "unknown"


def test_no_double_send_to_the_default_destination() -> None:
    """After channel_publish to the default destination, the closing prose is a draft there; a pin still sends."""
    segments = route_prose("done\n>>> ops\nfyi", ROOM, VIEWS, published_default=True)
    assert segments[0] == Segment(text="done", destination=None, reason=ALREADY_PUBLISHED, target=ROOM)
    assert segments[1].destination == Destination(server_id="zulip", channel_id="stream:ops")


lines = st.sampled_from(["plain", ">>> ops", ">>> general", ">>> unknown place", "", ">>>ops", "  >>> ops  "])


@given(st.lists(lines, max_size=12))
def test_each_segment_goes_where_the_last_pin_before_it_says(prose_lines: list[str]) -> None:
    """Over any mix of pins and text, every segment's destination is the last real pin before it (else default)."""
    ops = Destination(server_id="zulip", channel_id="stream:ops")
    pins = {"ops": ops, "general": ROOM}
    expected: list[tuple[str, Destination]] = []
    current, text = ROOM, []
    for line in prose_lines:
        key = line.strip().removeprefix(">>> ").strip() if line.strip().startswith(">>> ") else None
        if key in pins:
            if "\n".join(text).strip():
                expected.append(("\n".join(text).strip("\n"), current))
            current, text = pins[key], []
        else:
            text.append(line)
    if "\n".join(text).strip():
        expected.append(("\n".join(text).strip("\n"), current))
    segments = route_prose("\n".join(prose_lines), ROOM, VIEWS, published_default=False)
    assert [(s.text, s.destination) for s in segments] == expected


def test_a_pin_holds_for_the_turns_later_prose() -> None:
    """route_after gives the last pin of a round's prose, refused or not, so later prose follows it."""
    ops = Destination(server_id="zulip", channel_id="stream:ops")
    views = [*VIEWS, view("a", "in", refusal="inbound_only")]
    assert route_after("before a tool call\n>>> ops\nto ops", ROOM, views) == ops
    assert route_after("no pin here", ops, views) == ops
    refused = route_after(">>> in\nmeant for in", ROOM, views)
    assert refused == Refused(reason="inbound_only", target=Destination(server_id="a", channel_id="in"))
    [later] = route_prose("closing words", refused, views, published_default=False)
    assert later.destination is None and later.reason == "inbound_only" and later.target == refused.target


class TestElsewhere:
    """A shared store: the wake's conversation on a connector another host runs (speech/routing.py elsewhere_view)."""

    HOME = Destination(server_id="chat", channel_id="room", thread_id="t")

    def test_the_wakes_conversation_on_another_hosts_connector_is_routed_there(self) -> None:
        views = elsewhere_view(self.HOME, [], ["chat"], lambda name: name == "chat")
        assert route_prose("hello", self.HOME, views, published_default=False) == [
            Segment(text="hello", destination=self.HOME)]
        assert resolve("chat/room", views) == Destination(server_id="chat", channel_id="room", thread_id=None)

    def test_a_channel_the_agent_does_not_hear_or_a_connector_run_here_adds_nothing(self) -> None:
        assert elsewhere_view(self.HOME, [], ["chat/other"], lambda _name: True) == []
        assert elsewhere_view(self.HOME, [], None, lambda _name: False) == []
        assert elsewhere_view(Undecided(reason="several"), [], None, lambda _name: True) == []
        (segment,) = route_prose("hello", self.HOME, [], published_default=False)
        assert segment.destination is None and segment.reason == "unknown"  # one host: unregistered is a draft

    def test_a_view_this_host_has_already_is_kept_as_it_is(self) -> None:
        refused = [view("chat", "room", refusal="inbound")]
        assert elsewhere_view(self.HOME, refused, None, lambda _name: True) == []
