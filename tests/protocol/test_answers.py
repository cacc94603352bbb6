"""Tests for mcplhost/protocol/answers.py: every answer decodes to its Struct or a bounded MalformedAnswer.

The property tests hold each Struct's leniency to an oracle written the way
the host judged answers before they were typed (isinstance over the decoded
JSON), so typing them changed no refusal and no skip.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec import UNSET

from mcplhost.protocol.answers import (
    MALFORMED_DETAIL_MAX_CHARS,
    Answer,
    BackscrollEntry,
    ContentBlock,
    HookAnswer,
    Injection,
    ListedTool,
    MalformedAnswer,
    OpenedChannel,
    PublishResult,
    ToolResult,
    ToolsPage,
    decode_answer,
    decode_each,
    decode_entries,
)
from mcplhost.protocol.jobs import MAX_PAGE_ENTRIES, read_tools_page

ANSWERS: list[type[Answer]] = [ToolsPage, ListedTool, OpenedChannel, BackscrollEntry, ContentBlock, ToolResult,
                               Injection, HookAnswer, PublishResult]
#: Every member name any answer has, so generated objects often hit them.
MEMBERS = sorted({field.encode_name for kind in ANSWERS for field in msgspec.structs.fields(kind)})

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(MEMBERS) | st.text(max_size=4),
                                                                       children, max_size=5),
    max_leaves=16)
#: Objects made of the answers' own members, each of any shape: the space where leniency matters.
member_objects = st.dictionaries(st.sampled_from(MEMBERS), json_values, max_size=8)
#: A member's value: often a string or an object, the shapes the answers want, else anything.
member_values = st.text(min_size=1, max_size=5) | st.dictionaries(st.text(max_size=3), scalars, max_size=2) | json_values


def objects_of(kind: type[Answer], **shapes: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Objects holding any of `kind`'s members (each in one of `shapes` or any shape), or any JSON value."""
    optional = {field.encode_name: shapes.get(field.encode_name, member_values)
                for field in msgspec.structs.fields(kind)}
    return st.fixed_dictionaries({}, optional=optional) | json_values


def encoded(value: Any) -> bytes:
    return msgspec.json.encode(value)


def outcome(raw: bytes, kind: type[Answer]) -> Answer | MalformedAnswer:
    try:
        return decode_answer(raw, kind, "test/method")
    except MalformedAnswer as exc:
        return exc


def non_empty_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class TestEveryShape:
    @given(json_values | member_objects, st.sampled_from(ANSWERS))
    def test_any_json_value_is_the_struct_or_a_malformed_answer(self, value: Any, kind: type[Answer]) -> None:
        """Never another exception, and a MalformedAnswer's detail is bounded."""
        decoded = outcome(encoded(value), kind)
        assert isinstance(decoded, kind | MalformedAnswer)
        if isinstance(decoded, MalformedAnswer):
            assert decoded.method == "test/method" and 0 < len(decoded.detail) <= MALFORMED_DETAIL_MAX_CHARS + 1

    @given(st.binary(max_size=64) | st.sampled_from([b"", b"{", b'{"name": 5', b"[" * 5000, b'{"a":1}}']),
           st.sampled_from(ANSWERS))
    def test_any_bytes_are_the_struct_or_a_malformed_answer(self, raw: bytes, kind: type[Answer]) -> None:
        assert isinstance(outcome(raw, kind), kind | MalformedAnswer)

    def test_nesting_too_deep_for_the_decoder_is_a_malformed_answer(self) -> None:
        """A session never hands over such a Raw (rpc/messages.py); decode_answer refuses it all the same."""
        deep = b'{"channel":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        assert isinstance(outcome(deep, OpenedChannel), MalformedAnswer)

    def test_a_long_detail_is_cut(self) -> None:
        exc = MalformedAnswer("tools/list", "x" * 10_000)
        assert exc.detail == "x" * MALFORMED_DETAIL_MAX_CHARS + "…" and len(str(exc)) < 300

    def test_a_member_decoded_alone_keeps_its_path_in_the_detail(self) -> None:
        """The second, member-by-member pass says where, like the first."""
        for raw, kind, where in [(b'{"name": ""}', ListedTool, "`$.name`"),
                                 (b'{"content": [1], "tags": 5}', BackscrollEntry, "`$.content[0]`"),
                                 (b'{"featureSet": 5, "contextInjections": 5}', HookAnswer, "`$.contextInjections`")]:
            decoded = outcome(raw, kind)
            assert isinstance(decoded, MalformedAnswer) and where in decoded.detail, decoded


class TestToolsList:
    @given(objects_of(ListedTool))
    def test_a_tool_is_kept_when_its_name_is_a_non_empty_string_and_odd_members_are_ignored(self, tool: Any) -> None:
        """Oracle: a dict with a non-empty string name; a description that is no string is empty, a schema no object none."""
        decoded = outcome(encoded(tool), ListedTool)
        if not isinstance(tool, dict) or non_empty_str(tool.get("name")) is None:
            assert isinstance(decoded, MalformedAnswer)
            return
        assert decoded == ListedTool(
            name=tool["name"], description=tool["description"] if isinstance(tool.get("description"), str) else "",
            inputSchema=tool["inputSchema"] if isinstance(tool.get("inputSchema"), dict) else None)

    @given(objects_of(ToolsPage, tools=st.lists(objects_of(ListedTool), max_size=4) | member_values))
    def test_a_page_lists_what_its_tools_array_holds_and_follows_only_a_string_cursor(self, page: Any) -> None:
        """Oracle: a page that is no object is malformed; `tools` no array lists none; a cursor no string ends it."""
        try:
            read, tools, malformed = read_tools_page(msgspec.json.decode(encoded(page), type=msgspec.Raw))
        except MalformedAnswer:
            assert not isinstance(page, dict)
            return
        entries = page.get("tools") if isinstance(page.get("tools"), list) else []
        assert len(tools) + malformed == len(entries)
        assert [t.name for t in tools] == [e["name"] for e in entries if isinstance(e, dict) and non_empty_str(e.get("name"))]
        cursor = page.get("nextCursor")
        assert read.nextCursor == (cursor if isinstance(cursor, str) else None)

    def test_a_page_judges_at_most_max_page_entries_and_counts_the_rest_as_skipped(self) -> None:
        """A page of a million junk entries costs MAX_PAGE_ENTRIES decode attempts, not a million."""
        junk = [{"name": f"t{i}"} for i in range(MAX_PAGE_ENTRIES)] + [7] * (3 * MAX_PAGE_ENTRIES)
        _, tools, malformed = read_tools_page(msgspec.json.decode(encoded({"tools": junk}), type=msgspec.Raw))
        assert (len(tools), malformed) == (MAX_PAGE_ENTRIES, 3 * MAX_PAGE_ENTRIES)
        late = [7] * MAX_PAGE_ENTRIES + [{"name": "never-read"}]
        _, tools, malformed = read_tools_page(msgspec.json.decode(encoded({"tools": late}), type=msgspec.Raw))
        assert (tools, malformed) == ([], MAX_PAGE_ENTRIES + 1)

    def test_entries_are_judged_one_by_one(self) -> None:
        page = decode_answer(encoded({"tools": [{"name": "a"}, 1, {"name": ""}, {"name": "b", "x": [1]}]}),
                             ToolsPage, "tools/list")
        tools, malformed = decode_entries(page.tools, ListedTool)
        assert ([t.name for t in tools], malformed) == (["a", "b"], 2)
        assert [t.name if t is not None else None for t in decode_each(page.tools, ListedTool)] == [
            "a", None, None, "b"]


class TestChannelsOpen:
    @pytest.mark.parametrize("result", ["opened", 5, None, [{"channel": {}}]])
    def test_a_result_that_is_not_an_object_is_malformed(self, result: Any) -> None:
        assert isinstance(outcome(encoded(result), OpenedChannel), MalformedAnswer)

    def test_the_descriptor_is_kept_whatever_it_is_and_messages_that_are_no_array_are_none(self) -> None:
        """The descriptor is the registry's to judge (protocol/channels.py), so any value passes through."""
        for channel in ({"id": "x"}, "x", [1], 5):
            assert outcome(encoded({"channel": channel, "messages": {"a": 1}}), OpenedChannel) == OpenedChannel(
                channel=channel)
        assert outcome(encoded({}), OpenedChannel) == OpenedChannel()

    @given(objects_of(BackscrollEntry, content=st.lists(st.dictionaries(st.sampled_from(["type", "text"]), member_values, max_size=2), max_size=3) | member_values,
                      author=objects_of(BackscrollEntry) | st.fixed_dictionaries({"name": member_values})))
    def test_a_backscroll_entry_needs_content_and_ignores_odd_members(self, entry: Any) -> None:
        """Oracle: content a string or an array of objects; every other member of another shape counts as absent."""
        decoded = outcome(encoded(entry), BackscrollEntry)
        content = entry.get("content") if isinstance(entry, dict) else None
        if not (isinstance(content, str) or (isinstance(content, list)
                                             and all(isinstance(b, dict) for b in content))):
            assert isinstance(decoded, MalformedAnswer)
            return
        assert isinstance(decoded, BackscrollEntry) and decoded.content == content
        for member in ("channelId", "messageId", "threadId", "replyTo"):
            assert getattr(decoded, member) == non_empty_str(entry.get(member))
        author = entry.get("author")
        name = non_empty_str(author.get("name")) if isinstance(author, dict) else None
        assert (decoded.author.name if decoded.author is not None else None) == name
        assert decoded.metadata == (entry["metadata"] if isinstance(entry.get("metadata"), dict) else None)
        assert decoded.timestamp == (entry["timestamp"] if isinstance(entry.get("timestamp"), str) else None)


class TestToolsCall:
    @given(objects_of(ToolResult, content=st.lists(st.dictionaries(st.sampled_from(["type", "text"]), member_values, max_size=2), max_size=3) | member_values,
                      isError=st.booleans() | member_values))
    def test_a_result_is_an_object_whose_odd_content_and_is_error_count_as_absent(self, result: Any) -> None:
        decoded = outcome(encoded(result), ToolResult)
        if not isinstance(result, dict):
            assert isinstance(decoded, MalformedAnswer)
            return
        assert isinstance(decoded, ToolResult)
        content = result.get("content")
        assert [msgspec.json.decode(raw) for raw in decoded.content] == (content if isinstance(content, list) else [])
        assert decoded.isError is (result.get("isError") is True)
        assert decoded.structuredContent == result.get("structuredContent", UNSET)

    @given(objects_of(ContentBlock))
    def test_a_block_needs_a_string_type_and_its_other_members_count_only_as_strings(self, block: Any) -> None:
        decoded = outcome(encoded(block), ContentBlock)
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            assert isinstance(decoded, MalformedAnswer)
            return
        assert decoded == ContentBlock(**{k: block[k] for k in ("type", "text", "data", "mimeType")
                                          if isinstance(block.get(k), str)})


class TestBeforeInference:
    @pytest.mark.parametrize("answer", ["x", None, [], 5, {"contextInjections": {}}, {"contextInjections": "x"}])
    def test_an_answer_not_an_object_or_whose_injections_are_no_array_is_malformed(self, answer: Any) -> None:
        assert isinstance(outcome(encoded(answer), HookAnswer), MalformedAnswer)

    def test_an_odd_feature_set_is_ignored_and_no_injections_are_none(self) -> None:
        assert outcome(encoded({"featureSet": 5}), HookAnswer) == HookAnswer()
        assert outcome(encoded({"featureSet": "f", "more": 1}), HookAnswer) == HookAnswer(featureSet="f")

    @given(objects_of(Injection, content=st.lists(st.dictionaries(st.sampled_from(["type", "text"]), member_values, max_size=2), max_size=3) | member_values,
                      position=st.sampled_from(["system", "beforeUser", "afterUser", "x"]) | member_values))
    def test_an_injection_is_any_object_its_odd_members_absent(self, injection: Any) -> None:
        """So the hook's judge names the first member that fails, in its own order (agents/turns/hooks.py)."""
        decoded = outcome(encoded(injection), Injection)
        if not isinstance(injection, dict):
            assert isinstance(decoded, MalformedAnswer)
            return
        assert isinstance(decoded, Injection)
        position = injection.get("position")
        assert decoded.position == (position if isinstance(position, str) else None)
        assert decoded.namespace == non_empty_str(injection.get("namespace"))
        content = injection.get("content")
        if isinstance(content, str):
            assert decoded.content == content
        elif isinstance(content, list):
            assert decoded.content is not None and [msgspec.json.decode(bytes(r)) for r in decoded.content] == content
        else:
            assert decoded.content is None


class TestPublish:
    @pytest.mark.parametrize("result", ["delivered", [True], None, {}, {"delivered": "yes"}, {"delivered": 1},
                                        {"delivered": True, "messageId": 1002},
                                        {"delivered": True, "messageId": ["m"]}])
    def test_anything_but_delivered_and_an_optional_string_message_id_is_malformed(self, result: Any) -> None:
        assert isinstance(outcome(encoded(result), PublishResult), MalformedAnswer)

    def test_message_id_is_optional_and_more_members_are_ignored(self) -> None:
        assert outcome(encoded({"delivered": True}), PublishResult) == PublishResult(delivered=True)
        assert outcome(encoded({"delivered": False, "messageId": None, "x": {}}), PublishResult) == PublishResult(
            delivered=False)
        assert outcome(encoded({"delivered": True, "messageId": "m-1"}), PublishResult) == PublishResult(
            delivered=True, messageId="m-1")
