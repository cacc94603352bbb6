"""Tests for mcplhost/inbound/visible.py: has_visible_content."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.inbound.visible import has_visible_content
from tests.inbound.strategies import INVISIBLES, SPACES

from ..builders import text

ES_WHITESPACE = ["\t", "\n", "\x0b", "\x0c", "\r", " ", "\u2028", "\u2029", *SPACES, "\u2000", "\u200a", "\ufeff"]


class TestHasVisibleContent:
    def test_no_blocks(self) -> None:
        """No blocks show nothing."""
        assert not has_visible_content([])

    @pytest.mark.parametrize("body", ["", " ", "\n\t", "\u200b", "\u3164", "\ufeff \u200d", "\u00a0\u3000",
                                      "\U000e0061"])
    def test_blank_text(self, body: str) -> None:
        """Text of only whitespace and invisible characters shows nothing."""
        assert not has_visible_content([text(body), text("")])

    @pytest.mark.parametrize("body", ["a", " . ", "\U0001f431", "\u200bx", "\x01"])
    def test_visible_text(self, body: str) -> None:
        """One character neither whitespace nor invisible is visible (a bare control counts, by the rule's letter)."""
        assert has_visible_content([text(""), text(body)])

    @pytest.mark.parametrize(
        "block",
        [{"type": "image", "data": "", "mimeType": "image/png"}, {"type": "audio", "uri": "file:///a.ogg"},
         {"type": "resource", "uri": "https://example.com"}],
    )
    def test_media_is_visible(self, block: dict) -> None:
        """An image, audio or resource block is visible beside blank text."""
        assert has_visible_content([text(" "), block])

    def test_unknown_blocks_show_nothing(self) -> None:
        """A block of an unknown type does not count as visible."""
        assert not has_visible_content([{"type": "widget", "text": "hello"}])

    @given(st.lists(st.sampled_from([*ES_WHITESPACE, *INVISIBLES]), max_size=20).map("".join))
    def test_any_mix_of_blank_characters_is_blank(self, body: str) -> None:
        """Any mix of ECMAScript whitespace and invisible characters shows nothing."""
        assert not has_visible_content([text(body)])
