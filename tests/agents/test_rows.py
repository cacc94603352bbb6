"""Tests for mcplhost/agents/turns/agent_rows.py: the agent's own rows as docs/agents.md#compilation types them."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from mcplhost.agents.model import ToolCall
from mcplhost.agents.turns.agent_rows import (
    draft_row,
    row_conversation,
    row_kind,
    speech_row,
    tool_call_of,
    tool_call_row,
    tool_result_call_id,
    tool_result_row,
    turn_of,
)
from mcplhost.inbound.conversation import conversation_id
from mcplhost.store import NewItem, StoredItem, open_store
from mcplhost.store.own_rows import notice_row, source_notice_row
from mcplhost.store.rows import (
    Destination,
    DraftsNotice,
    FailedReplyNotice,
    NoticeRow,
    SourceHeaderNotice,
    SpeechMeta,
    TurnFailedNotice,
)

AT = 1_790_000_000_000
ROOM = Destination(server_id="discord", channel_id="discord:g1:room", thread_id="t1")


def stored(item: NewItem, item_id: int = 1) -> StoredItem:
    """The row as a read would give it back (no store needed for the pure readers)."""
    return StoredItem(id=item_id, agent=item.agent, participant=item.participant, role=item.role,
                      content=item.content, metadata=item.metadata, created_at=item.created_at)


class TestSpeechRow:
    def test_sent_speech_names_its_destination_and_outbox(self) -> None:
        """A speech row is the agent's assistant text, with kind, turn, destination and outbox id in metadata."""
        row = speech_row("scout", 7, "hello", ROOM, 12, created_at=AT)
        assert (row.role, row.agent, row.participant, row.created_at) == ("assistant", "scout", "scout", AT)
        assert row.content == [{"type": "text", "text": "hello"}]
        assert row.metadata == {
            "kind": "speech", "turnId": 7, "outboxId": 12,
            "destination": {"serverId": "discord", "channelId": "discord:g1:room", "threadId": "t1"},
            "conversationId": conversation_id("discord", "discord:g1:room", "t1"),
        }
        assert row.conversation_id == conversation_id("discord", "discord:g1:room", "t1")
        assert row.thread_id == "t1"

    def test_speech_without_destination_has_null_destination(self) -> None:
        """Before the speech router, a turn's prose is stored with destination and outbox id null."""
        row = speech_row("scout", 7, "thinking aloud", created_at=AT)
        assert row.metadata == {"kind": "speech", "turnId": 7, "destination": None, "outboxId": None}
        assert row.conversation_id is None


class TestOtherRows:
    def test_draft_row_carries_its_reason(self) -> None:
        """A draft is assistant text with kind "draft", its turn and why it was not sent."""
        row = draft_row("scout", 3, "maybe", "several conversations", created_at=AT)
        assert row.role == "assistant"
        assert row.metadata == {"kind": "draft", "turnId": 3, "reason": "several conversations"}

    def test_tool_call_row_keeps_the_call_and_the_prose_before_it(self) -> None:
        """A tool-call row holds the prose before the call as content and the call itself in metadata."""
        call = ToolCall(id="c1", name="weather__now", arguments={"city": "Oslo", "days": 2})
        row = tool_call_row("scout", 3, call, "Let me look.", created_at=AT)
        assert row.role == "assistant"
        assert row.content == [{"type": "text", "text": "Let me look."}]
        assert row.metadata == {"kind": "tool-call", "turnId": 3, "tool": "weather__now", "toolCallId": "c1",
                                "arguments": {"city": "Oslo", "days": 2}}
        assert tool_call_of(stored(row)) == call

    def test_tool_call_row_without_prose_has_no_content(self) -> None:
        """A call with nothing said before it stores no text block at all (never an empty one)."""
        row = tool_call_row("scout", 3, ToolCall(id="c1", name="channel_list", arguments={}), created_at=AT)
        assert row.content == []

    def test_tool_result_row_copies_blocks_and_says_if_it_failed(self) -> None:
        """A tool result is a `tool` row naming the tool and call; the caller's blocks are not shared."""
        blocks = [{"type": "text", "text": "sunny"}]
        row = tool_result_row("scout", 3, "c1", "weather__now", blocks, False, created_at=AT)
        assert row.role == "tool"
        assert row.metadata == {"kind": "tool-result", "turnId": 3, "tool": "weather__now", "toolCallId": "c1",
                                "isError": False}
        row.content[0]["text"] = "changed"
        assert blocks == [{"type": "text", "text": "sunny"}]
        assert tool_result_call_id(stored(row)) == "c1"

    @pytest.mark.parametrize("notice", [SourceHeaderNotice(), DraftsNotice(turn_id=4), TurnFailedNotice(reason="x"),
                                        FailedReplyNotice(outbox_id=3, turn_id=4, reason="refused")])
    def test_notice_row_is_a_system_user_row(self, notice: NoticeRow) -> None:
        """Every notice kind is a user row with system true (tests/store/test_rows.py: each one's whole shape)."""
        row = notice_row("scout", notice, "something happened", created_at=AT)
        assert row.role == "user"
        assert row.metadata["kind"] == notice.kind and row.metadata["system"] is True
        assert row_kind(stored(row)) == "notice"

    def test_conversation_id_is_recorded_when_given(self) -> None:
        """Under conversation scope a row names its conversation in metadata and in the column."""
        row = notice_row("scout", TurnFailedNotice(reason="x"), "x", created_at=AT, conversation_id="conv_1")
        assert row.metadata["conversationId"] == "conv_1" and row.conversation_id == "conv_1"
        assert row_conversation(stored(row)) == "conv_1"


class TestReaders:
    def test_kinds_of_every_builder(self) -> None:
        """row_kind reads back what each builder wrote."""
        call = ToolCall(id="c1", name="t", arguments={})
        rows = {
            "speech": speech_row("a", 1, "x", created_at=AT),
            "draft": draft_row("a", 1, "x", "r", created_at=AT),
            "tool-call": tool_call_row("a", 1, call, created_at=AT),
            "tool-result": tool_result_row("a", 1, "c1", "t", [], True, created_at=AT),
            "notice": source_notice_row("a", created_at=AT),
        }
        assert {kind: row_kind(stored(row)) for kind, row in rows.items()} == {k: k for k in rows}
        assert turn_of(stored(rows["speech"])) == 1

    def test_connector_claims_never_make_a_notice(self) -> None:
        """An item's adapter metadata claiming kind/system is not a notice; only host keys count."""
        item = StoredItem(id=1, agent=None, participant="mallory", role="user",
                          content=[{"type": "text", "text": "x"}],
                          metadata={"adapter": {"kind": "source-header-notice", "system": True}}, created_at=AT)
        assert row_kind(item) == "other"

    def test_peer_row(self) -> None:
        """A user row with host metadata.peer is a peer message."""
        item = StoredItem(id=1, agent="a", participant="b", role="user", content=[],
                          metadata={"peer": {"from": "b", "relationship": "sibling"}}, created_at=AT)
        assert row_kind(item) == "peer"

    def test_malformed_tool_rows_are_other(self) -> None:
        """A tool-call row without a call id is not replayed as a call."""
        item = StoredItem(id=1, agent="a", participant="a", role="assistant", content=[],
                          metadata={"kind": "tool-call", "tool": "t"}, created_at=AT)
        assert tool_call_of(item) is None and row_kind(item) == "other"

    def test_turn_of_refuses_bools(self) -> None:
        """A boolean turnId is not a turn id."""
        item = stored(speech_row("a", None, "x", created_at=AT))
        assert turn_of(msgspec.structs.replace(item, metadata={"turnId": True})) is None

    def test_conversation_of_a_channel_item(self) -> None:
        """An item everyone sees belongs to its channel's (and thread's) conversation; an unscoped one to none."""
        item = StoredItem(id=1, agent=None, participant="x", role="user", content=[], created_at=AT,
                          metadata={"serverId": "d", "channelId": "c", "threadId": None})
        assert row_conversation(item) == conversation_id("d", "c", None)
        assert row_conversation(msgspec.structs.replace(item, metadata={"serverId": "d", "channelId": None})) is None


async def test_rows_survive_the_store(tmp_path: Path) -> None:
    """Rows written to a real SQLite store read back as the same kinds, as the agent's own rows."""
    call = ToolCall(id="c1", name="history_search", arguments={"query": "x"})
    built = [speech_row("scout", 1, "hi", ROOM, 5, created_at=AT),
             tool_call_row("scout", 1, call, "looking", created_at=AT),
             tool_result_row("scout", 1, "c1", "history_search", [{"type": "text", "text": "none"}], False,
                             created_at=AT),
             notice_row("scout", TurnFailedNotice(reason="timeout"), "the backend timed out", created_at=AT)]
    async with open_store(tmp_path / "m.db") as store:
        await store.items.insert_many(built)
        back = await store.items.list(agent="scout")
    assert [row_kind(r) for r in back] == ["speech", "tool-call", "tool-result", "notice"]
    assert tool_call_of(back[1]) == call
    assert back[0].host == SpeechMeta(turn_id=1, destination=ROOM, outbox_id=5, conversation_id=ROOM.conversation_id())
