"""Tests for mcplhost/store/rows.py and own_rows.py: a row's metadata read typed, and each host row's shape."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec import UNSET

from mcplhost.inbound.notice import SOURCE_RULE_TEXT
from mcplhost.inbound.strip import strip_host_keys
from mcplhost.store import NewItem, StoredItem
from mcplhost.store.own_rows import notice_row, own_row, source_notice_row, text_content
from mcplhost.store.rows import (
    HOST_KINDS,
    NOTICE_KINDS,
    ChannelSource,
    Destination,
    DraftMeta,
    DraftsNotice,
    FailedReplyNotice,
    ItemMeta,
    PeerFrom,
    PeerMeta,
    SourceHeaderNotice,
    SpeechMeta,
    SurfaceSource,
    ToolCallMeta,
    ToolResultMeta,
    TurnFailedNotice,
    UnscopedSource,
    host_row,
    item_meta,
    row_metadata,
)

AT = 1_790_000_000_000
ROOM = Destination(server_id="d", channel_id="d:g:room", thread_id="t1")
CHANNEL_ITEM = {
    "serverId": "d", "channelId": "d:g:room", "messageId": "m-1", "threadId": None, "eventId": None,
    "featureSet": None, "tags": ["chat:addressed"],
    "source": {"kind": "channel", "lane": "channels/incoming", "serverId": "d", "channelId": "d:g:room",
               "label": "#room", "messageId": "m-1", "acceptedAt": AT},
    "sourceHeader": "[source: d / d:g:room · #room]", "sourceBodyDigest": "0" * 64, "storedBodyDigest": "1" * 64,
    "adapter": {"kind": "speech", "system": True, "sourceHeader": "forged"}, "authorId": "u-1",
}


class TestItemMeta:
    def test_a_channel_items_keys_read_typed(self) -> None:
        """The ids, tags, frozen source, header and author of a channel item, as ingest stored them."""
        meta = item_meta(CHANNEL_ITEM)
        assert (meta.server_id, meta.channel_id, meta.message_id, meta.thread_id) == ("d", "d:g:room", "m-1", None)
        assert meta.tags == ("chat:addressed",) and meta.author_id == "u-1" and meta.echo_of is None
        assert meta.source == ChannelSource(lane="channels/incoming", server_id="d", channel_id="d:g:room",
                                            label="#room", message_id="m-1", accepted_at=AT)
        assert meta.source_header == "[source: d / d:g:room · #room]"

    def test_each_source_kind_is_its_own_struct(self) -> None:
        """`source.kind` is the tag: channel, unscoped and surface envelopes decode to their own Structs."""
        for kind, cls in (("channel", ChannelSource), ("unscoped", UnscopedSource), ("surface", SurfaceSource)):
            source = item_meta({"source": {"kind": kind, "serverId": "x"}}).source
            assert type(source) is cls and source.kind == kind

    def test_the_connectors_object_is_never_read(self) -> None:
        """Keys inside `metadata.adapter` (the connector's claims) are not the host's: they make nothing."""
        assert host_row(CHANNEL_ITEM) is None
        assert item_meta({"adapter": {"serverId": "x", "echoOf": 1}}) == ItemMeta()

    def test_absent_and_malformed_members_read_as_absent_alone(self) -> None:
        """A member of the wrong type reads as its default, the rest of the row as stored (as the probes read)."""
        assert item_meta({"tags": ["chat:addressed", 3, None, "x"]}).tags == ("chat:addressed", "x")
        meta = item_meta({**CHANNEL_ITEM, "serverId": 7, "tags": "chat:addressed",
                          "source": {**CHANNEL_ITEM["source"], "acceptedAt": True, "label": ["x"]}})
        assert meta.server_id is None and meta.tags == () and meta.channel_id == "d:g:room"
        assert meta.source is not None and meta.source.accepted_at is None and meta.source.label is None
        assert meta.source.lane == "channels/incoming"
        assert item_meta({"source": {"kind": "elsewhere"}}).source is None
        assert item_meta(None) == item_meta({}) == item_meta([1]) == ItemMeta()

    def test_an_echo_mark_is_an_outbox_id_or_true(self) -> None:
        """`echoOf` keeps what it says: the publish's outbox id, or True when only the from-self tag said so."""
        assert item_meta({"echoOf": 12}).echo_of == 12
        assert item_meta({"echoOf": True}).echo_of is True

    @given(st.dictionaries(st.sampled_from(["serverId", "tags", "source", "echoOf", "sourceHeader", "kind", "peer",
                                            "turnId", "toolCallId", "tool", "system", "destination", "arguments"]),
                           st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                                        lambda inner: st.lists(inner, max_size=3)
                                        | st.dictionaries(st.sampled_from(["kind", "from", "serverId", "channelId"]),
                                                          inner, max_size=3),
                                        max_leaves=8)))
    def test_any_metadata_reads_without_raising(self, metadata: dict) -> None:
        """Whatever a row holds, reading it typed never raises: a reader above the store is never failed by it."""
        item_meta(metadata)
        host_row(metadata)


class TestHostRows:
    @pytest.mark.parametrize(("row", "metadata"), [
        (SpeechMeta(turn_id=7, destination=ROOM, outbox_id=3, conversation_id="conv_1", failure_reply=True,
                    outbox_ids=[3, 4]),
         {"kind": "speech", "turnId": 7, "destination": {"serverId": "d", "channelId": "d:g:room", "threadId": "t1"},
          "outboxId": 3, "conversationId": "conv_1", "failureReply": True, "outboxIds": [3, 4]}),
        (SpeechMeta(turn_id=None), {"kind": "speech", "turnId": None, "destination": None, "outboxId": None}),
        (DraftMeta(turn_id=3, reason="undecided"), {"kind": "draft", "turnId": 3, "reason": "undecided"}),
        (ToolCallMeta(turn_id=3, tool="t", tool_call_id="c1", arguments={"a": 1}),
         {"kind": "tool-call", "turnId": 3, "tool": "t", "toolCallId": "c1", "arguments": {"a": 1}}),
        (ToolResultMeta(turn_id=3, tool="t", tool_call_id="c1", is_error=True),
         {"kind": "tool-result", "turnId": 3, "tool": "t", "toolCallId": "c1", "isError": True}),
        (SourceHeaderNotice(system=True), {"kind": "source-header-notice", "system": True}),
        (DraftsNotice(turn_id=4, system=True, conversation_id="conv_1"),
         {"turnId": 4, "kind": "drafts", "system": True, "conversationId": "conv_1"}),
        (TurnFailedNotice(reason="timeout", system=True), {"reason": "timeout", "kind": "turn-failed", "system": True}),
        (FailedReplyNotice(outbox_id=5, turn_id=None, reason="refused", destination=ROOM, system=True),
         {"outboxId": 5, "turnId": None, "reason": "refused",
          "destination": {"serverId": "d", "channelId": "d:g:room", "threadId": "t1"}, "kind": "failed-reply",
          "system": True, "conversationId": None}),
        (PeerMeta(peer=PeerFrom(sender="lead", relationship="ancestor"), dispatch="turn-end", peer_message_id=2),
         {"peer": {"from": "lead", "relationship": "ancestor"}, "dispatch": "turn-end", "peerMessageId": 2}),
    ])
    def test_each_row_is_written_in_its_shape_and_read_back(self, row: object, metadata: dict) -> None:
        """`row_metadata` writes the keys in the order rows were always written (byte for byte once encoded);
        `host_row` reads the same Struct back."""
        written = row_metadata(row)  # type: ignore[arg-type]
        assert msgspec.json.encode(written) == msgspec.json.encode(metadata)
        assert host_row(written) == row

    def test_every_kind_has_its_struct(self) -> None:
        """The kinds of docs/agents.md's table, and the four notice kinds among them."""
        assert set(HOST_KINDS) == {"speech", "draft", "tool-call", "tool-result", "source-header-notice", "drafts",
                                   "failed-reply", "turn-failed"}
        assert NOTICE_KINDS == {"source-header-notice", "drafts", "failed-reply", "turn-failed"}

    def test_a_kind_without_its_needed_members_is_no_row_of_it(self) -> None:
        """A tool call without its id, or with an id of the wrong type, is not a tool call."""
        assert host_row({"kind": "tool-call", "tool": "t"}) is None
        assert host_row({"kind": "tool-call", "tool": "t", "toolCallId": 3}) is None
        assert host_row({"kind": "tool-result"}) is None

    def test_members_a_kind_can_do_without_read_as_defaults(self) -> None:
        """A bare speech row is a speech row; malformed arguments read as none; an unknown kind is no kind."""
        assert host_row({"kind": "speech"}) == SpeechMeta()
        call = host_row({"kind": "tool-call", "tool": "t", "toolCallId": "c", "arguments": [1]})
        assert call == ToolCallMeta(tool="t", tool_call_id="c")
        assert host_row({"kind": "speech", "turnId": True}) == SpeechMeta(turn_id=None)
        assert host_row({"kind": "later-kind"}) is None

    def test_a_peer_row_says_whether_it_came_between_turns(self) -> None:
        """A peer row without `turnId` was delivered between turns (it wakes its agent); with one, inside that turn."""
        between = host_row({"peer": {"from": "lead"}})
        inside = host_row({"peer": {"from": "lead"}, "turnId": 4})
        assert isinstance(between, PeerMeta) and between.between_turns and between.peer.relationship is None
        assert isinstance(inside, PeerMeta) and not inside.between_turns and inside.turn_id == 4
        assert host_row({"peer": "lead"}) is None

    def test_the_rows_read_typed_from_new_and_stored_items_alike(self) -> None:
        """`meta` and `host` are read once per item and are no fields: the export never holds them."""
        row = own_row("scout", "assistant", text_content("hi"), SpeechMeta(turn_id=1, destination=ROOM),
                      created_at=AT, conversation_id=ROOM.conversation_id(), thread_id="t1")
        stored = StoredItem(id=1, agent=row.agent, participant=row.participant, role=row.role, content=row.content,
                            metadata=row.metadata, created_at=row.created_at)
        assert row.host == stored.host == SpeechMeta(turn_id=1, destination=ROOM,
                                                    conversation_id=ROOM.conversation_id())
        assert stored.host is stored.host  # decoded once
        assert set(msgspec.json.decode(msgspec.json.encode(stored))) == {
            "id", "agent", "participant", "role", "content", "metadata", "createdAt"}
        assert msgspec.structs.replace(stored, metadata={}).host is None


class TestOwnRows:
    def test_an_own_row_belongs_to_its_agent_and_conversation(self) -> None:
        """agent and participant are the agent; a conversation is in the column and in `conversationId`."""
        row = own_row("scout", "assistant", [], DraftMeta(turn_id=1, reason="r"), created_at=AT,
                      conversation_id="conv_1")
        assert (row.agent, row.participant, row.conversation_id, row.thread_id) == ("scout", "scout", "conv_1", None)
        assert row.metadata == {"kind": "draft", "turnId": 1, "reason": "r", "conversationId": "conv_1"}
        assert "conversationId" not in own_row("scout", "assistant", [], DraftMeta(), created_at=AT).metadata

    def test_a_notice_is_a_system_user_row(self) -> None:
        """Whatever the Struct says of `system`, a notice row is written with it true."""
        row = notice_row("scout", DraftsNotice(turn_id=2), "Not sent.", created_at=AT)
        assert isinstance(row, NewItem) and row.role == "user" and row.content == text_content("Not sent.")
        assert row.metadata == {"turnId": 2, "kind": "drafts", "system": True}

    def test_the_source_notice_is_the_rule(self) -> None:
        """The one-time notice is one text block of the rule, marked as the host's own notice."""
        row = source_notice_row("scout", created_at=AT, conversation_id="conv_1")
        assert row.content == [{"type": "text", "text": SOURCE_RULE_TEXT}]
        assert row.metadata == {"kind": "source-header-notice", "system": True, "conversationId": "conv_1"}

    def test_a_connector_cannot_claim_to_be_a_notice(self) -> None:
        """Both keys that make a row a notice are host keys, so strip removes a connector's copy."""
        metadata = source_notice_row("scout", created_at=AT).metadata
        kept, dropped = strip_host_keys(dict(metadata))
        assert kept == {} and set(dropped) == set(metadata)

    def test_unset_members_are_left_out(self) -> None:
        """A member a row has only sometimes is absent, not null, when it has none."""
        meta = PeerMeta(peer=PeerFrom(sender="a", relationship="sibling"), turn_id=UNSET)
        assert row_metadata(meta) == {"peer": {"from": "a", "relationship": "sibling"}, "dispatch": None}
