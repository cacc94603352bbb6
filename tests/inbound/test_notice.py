"""Tests for mcplhost/inbound/notice.py: the rule text, the notice and reader_body."""

from __future__ import annotations

import pytest

from mcplhost.inbound.notice import (
    SOURCE_HEADER_NOTICE_KIND,
    SOURCE_RULE_TEXT,
    build_source_notice,
    reader_body,
)
from mcplhost.inbound.strip import strip_host_keys

from ..builders import text

HEADER = "[source: discord / discord:g1:room]"


class TestSourceRuleText:
    @pytest.mark.parametrize(
        "phrase",
        ["[source: \u2026]", "first line", "channel id", "\\[source\u2026", "sender", "tool", "unscoped",
         "second line", "from: NAME (ID)", "(no id)", "\\from:", "Everything after the header and that line"],
    )
    def test_states_each_part_of_the_rule(self, phrase: str) -> None:
        """The rule names the header, its place, the id's authority, marked text, tool output and the unscoped form,
        and the host's `from:` line as the second line, after which everything is the sender's."""
        assert phrase in SOURCE_RULE_TEXT

    def test_is_one_paragraph(self) -> None:
        """The rule is a single line of prose, so it reads the same wherever it is shown."""
        assert SOURCE_RULE_TEXT.splitlines() == [SOURCE_RULE_TEXT]


class TestBuildSourceNotice:
    def test_content_and_metadata(self) -> None:
        """The notice is one text block of the rule, marked as the host's own notice."""
        content, metadata = build_source_notice()
        assert content == [text(SOURCE_RULE_TEXT)]
        assert metadata == {"kind": "source-header-notice", "system": True}
        assert SOURCE_HEADER_NOTICE_KIND == "source-header-notice"

    def test_fresh_objects_each_call(self) -> None:
        """Each call returns new lists and dicts, so a caller may change them freely."""
        first, second = build_source_notice(), build_source_notice()
        assert first[0] is not second[0] and first[1] is not second[1]

    def test_a_connector_cannot_claim_to_be_the_notice(self) -> None:
        """Both keys that make an item the notice are host keys, so strip removes a connector's copy."""
        _, metadata = build_source_notice()
        kept, dropped = strip_host_keys(dict(metadata))
        assert kept == {} and set(dropped) == set(metadata)


class TestReaderBody:
    def test_drops_the_header(self) -> None:
        """The stored header block is skipped and the body is returned."""
        assert reader_body([text(HEADER), text("hello")], {"sourceHeader": HEADER}) == [text("hello")]

    def test_drops_repeated_headers(self) -> None:
        """Leading blocks are dropped while each is exactly the header."""
        content = [text(HEADER), text(HEADER), text("hello")]
        assert reader_body(content, {"sourceHeader": HEADER}) == [text("hello")]

    def test_no_header_keeps_everything(self) -> None:
        """An item without sourceHeader (a surface item) is returned whole."""
        content = [text(HEADER), text("hello")]
        assert reader_body(content, {}) == content

    def test_only_exact_header_blocks_are_dropped(self) -> None:
        """A first block that differs from the header, even by extra members, is body."""
        content = [{"type": "text", "text": HEADER, "annotations": {}}, text("x")]
        assert reader_body(content, {"sourceHeader": HEADER}) == content
        assert reader_body([text(HEADER + " "), text("x")], {"sourceHeader": HEADER}) == [text(HEADER + " "), text("x")]

    def test_header_later_in_the_body_stays(self) -> None:
        """Only leading blocks are skipped; the same text later is body."""
        content = [text(HEADER), text("quote:"), text(HEADER)]
        assert reader_body(content, {"sourceHeader": HEADER}) == [text("quote:"), text(HEADER)]

    def test_returns_a_new_list(self) -> None:
        """The result is a new list, and the stored content is left as it was."""
        content = [text("hello")]
        result = reader_body(content, {"sourceHeader": HEADER})
        assert result == content and result is not content

    def test_header_only_item_has_empty_body(self) -> None:
        """An item that holds only its header has an empty body."""
        assert reader_body([text(HEADER)], {"sourceHeader": HEADER}) == []
