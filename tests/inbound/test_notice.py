"""Tests for mcplhost/inbound/notice.py: the rule text and reader_body (the notice row: tests/store/test_rows.py)."""

from __future__ import annotations

import pytest

from mcplhost.inbound.notice import SOURCE_RULE_TEXT, reader_body

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


class TestReaderBody:
    def test_drops_the_header(self) -> None:
        """The stored header block is skipped and the body is returned."""
        assert reader_body([text(HEADER), text("hello")], HEADER) == [text("hello")]

    def test_drops_repeated_headers(self) -> None:
        """Leading blocks are dropped while each is exactly the header."""
        content = [text(HEADER), text(HEADER), text("hello")]
        assert reader_body(content, HEADER) == [text("hello")]

    def test_no_header_keeps_everything(self) -> None:
        """An item without sourceHeader (a surface item) is returned whole."""
        content = [text(HEADER), text("hello")]
        assert reader_body(content, None) == content

    def test_only_exact_header_blocks_are_dropped(self) -> None:
        """A first block that differs from the header, even by extra members, is body."""
        content = [{"type": "text", "text": HEADER, "annotations": {}}, text("x")]
        assert reader_body(content, HEADER) == content
        assert reader_body([text(HEADER + " "), text("x")], HEADER) == [text(HEADER + " "), text("x")]

    def test_header_later_in_the_body_stays(self) -> None:
        """Only leading blocks are skipped; the same text later is body."""
        content = [text(HEADER), text("quote:"), text(HEADER)]
        assert reader_body(content, HEADER) == [text("quote:"), text(HEADER)]

    def test_returns_a_new_list(self) -> None:
        """The result is a new list, and the stored content is left as it was."""
        content = [text("hello")]
        result = reader_body(content, HEADER)
        assert result == content and result is not content

    def test_header_only_item_has_empty_body(self) -> None:
        """An item that holds only its header has an empty body."""
        assert reader_body([text(HEADER)], HEADER) == []
