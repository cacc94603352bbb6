"""Tests for mcplhost/inbound/patterns.py: the character classes and the fast opening pattern."""

from __future__ import annotations

import re

import pytest
import regex
from hypothesis import given

from mcplhost.inbound import patterns
from mcplhost.inbound.lookalikes import reads_as
from tests.inbound.strategies import marking_text

ALL_CODE_POINTS = "".join(map(chr, range(0x110000)))


def _matches(pattern: str, char: str) -> bool:
    return regex.fullmatch(pattern, char) is not None


class TestWhitespace:
    @pytest.mark.parametrize(
        "char",
        ["\t", "\n", "\x0b", "\x0c", "\r", " ", "\xa0", "\u1680", "\u2000", "\u200a", "\u2028", "\u2029",
         "\u202f", "\u205f", "\u3000", "\ufeff"],
    )
    def test_ecmascript_whitespace_is_whitespace(self, char: str) -> None:
        """Every character of the ECMAScript `\\s` list is in the class."""
        assert _matches(f"[{patterns.WHITESPACE}]", char)

    @pytest.mark.parametrize("char", ["\x1c", "\x1f", "\x85", "\u180e", "\u200b", "a"])
    def test_python_only_whitespace_is_not(self, char: str) -> None:
        """Characters Python's `\\s` (or an old Unicode) calls space are not in the class."""
        assert not _matches(f"[{patterns.WHITESPACE}]", char)


class TestInvisible:
    @pytest.mark.parametrize(
        "char",
        ["\u200b", "\u200d", "\u00ad", "\u034f", "\u3164", "\ufe0f", "\ufff9", "\u202e", "\u2066", "\u180e",
         "\U000e0061", "\U000e01ef"],
    )
    def test_format_and_default_ignorable_characters(self, char: str) -> None:
        """Cf and Default_Ignorable_Code_Point characters, including fillers and selectors, are invisible."""
        assert _matches(f"[{patterns.INVISIBLE}]", char)

    @pytest.mark.parametrize("char", [" ", "\xa0", "a", "\u20e3", "\U0001f431"])
    def test_visible_characters(self, char: str) -> None:
        """Spaces, letters, the keycap mark and emoji are not invisible."""
        assert not _matches(f"[{patterns.INVISIBLE}]", char)


class TestStructural:
    @pytest.mark.parametrize("text", ["[", "]", "\u00b7", '"', "\\", "\x00", "\x1f", "\x7f", "\x9f", "\u2028",
                                      "\u2029", "a / b", "a\u00a0/\tb"])
    def test_structural(self, text: str) -> None:
        """Grammar characters, controls, line separators and a spaced slash are structural."""
        assert patterns.STRUCTURAL_RE.search(text) is not None

    @pytest.mark.parametrize("text", ["a/b", "a /b", "a/ b", "/ b", "a /", "\xa0", "\u200b", "(x)", ":"])
    def test_not_structural(self, text: str) -> None:
        """A slash without whitespace on both sides, and unseen characters, are not structural."""
        assert patterns.STRUCTURAL_RE.search(text) is None


class TestEmojiSequence:
    @pytest.mark.parametrize(
        "text",
        ["\u2764\ufe0f", "\U0001f44d\U0001f3fd", "\U0001f469\u200d\U0001f4bb", "\U0001f3f3\ufe0f\u200d\U0001f308",
         "\U0001f431"],
    )
    def test_whole_sequences(self, text: str) -> None:
        """A pictograph with its selector, modifier and ZWJ links is one sequence."""
        assert patterns.EMOJI_SEQUENCE_RE.fullmatch(text) is not None

    @pytest.mark.parametrize("text", ["1\ufe0f\u20e3", "\ufe0f", "\u200d\U0001f431", "\U0001f3f4\U000e0067"])
    def test_not_sequences(self, text: str) -> None:
        """Keycaps, a bare selector, a leading ZWJ and tag flags are not whole sequences."""
        assert patterns.EMOJI_SEQUENCE_RE.fullmatch(text) is None


class TestFastOpening:
    def test_ignorable_class_agrees_with_regex_tables(self) -> None:
        """The derived `re` ignorable class holds exactly the code points the `regex` class holds."""
        ignorable = patterns.derived_ignorable_class()
        assert re.findall(ignorable, ALL_CODE_POINTS) == regex.findall(patterns.IGNORABLE, ALL_CODE_POINTS)

    def test_the_class_stored_for_a_regex_release_is_what_that_release_scans(self) -> None:
        """A start under the stored class's `regex` release reads it instead of scanning: the two are the same."""
        release, stored = patterns.STORED_IGNORABLE_CLASS
        scanned = patterns.scanned_ignorable_class()
        assert patterns.derived_ignorable_class() == scanned
        if regex.__version__ == release:
            assert stored == scanned

    @pytest.mark.parametrize("letter", list("source"))
    def test_letter_classes_hold_every_case_folding(self, letter: str) -> None:
        """What reads as each letter holds everything `regex` full case folding matches (docs/provenance.md §4), and more."""
        expected = set(regex.findall(rf"(?fi:{letter})", ALL_CODE_POINTS))
        assert expected <= set(re.findall(reads_as(letter), ALL_CODE_POINTS))

    def test_long_s_is_a_letter_s(self) -> None:
        """Case folding makes `ſ` an `s`, as docs/provenance.md says."""
        assert re.fullmatch(reads_as("s"), "\u017f")

    @given(marking_text)
    def test_agrees_with_reference_pattern(self, text: str) -> None:
        """The fast pattern finds the same openings as the `regex` reference pattern."""
        fast = [m.start() for m in patterns.fast_opening_re().finditer(text)]
        assert fast == [m.start() for m in patterns.OPENING_RE.finditer(text)]
