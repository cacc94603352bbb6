"""Tests for mcplhost/inbound/quoting.py: quoted, header_value and label_value."""

from __future__ import annotations

import json

import pytest
import regex
from hypothesis import assume, example, given
from hypothesis import strategies as st

from mcplhost.inbound import header_value, label_value, quoted
from tests.inbound.strategies import EMOJI_SEQUENCES, INVISIBLES, SPACES, any_text

# An oracle for "would need quotes", written from docs/provenance.md §3's words
# with the simplest tools: a set of characters, and a per-character check
# after emoji sequences are removed.
_STRUCTURAL_CHARS = set('[]\u00b7"\\\u2028\u2029') | {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]}
_ES_SPACE = set("\t\n\x0b\x0c\r \xa0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff") | {
    chr(c) for c in range(0x2000, 0x200B)
}
_EMOJI = regex.compile(
    r"\p{Extended_Pictographic}[\p{Emoji_Modifier}\ufe0e\ufe0f]?"
    r"(?:\u200d\p{Extended_Pictographic}[\p{Emoji_Modifier}\ufe0e\ufe0f]?)*"
)
_LINE_BREAKING = {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]}


def _unseen(char: str) -> bool:
    if char != " " and regex.fullmatch(r"\p{Zs}", char):
        return True
    return regex.fullmatch(r"[\p{Cf}\p{Default_Ignorable_Code_Point}\p{Cs}]", char) is not None


def oracle_needs_quotes(v: str) -> bool:
    if any(c in _STRUCTURAL_CHARS for c in v):
        return True
    if any(c == "/" and 0 < i < len(v) - 1 and v[i - 1] in _ES_SPACE and v[i + 1] in _ES_SPACE
           for i, c in enumerate(v)):
        return True
    return any(_unseen(c) for c in _EMOJI.sub("", v))


def no_paired_surrogates(v: str) -> bool:
    """JSON cannot spell a high surrogate followed by a low one as two characters."""
    return regex.search(r"[\ud800-\udbff][\udc00-\udfff]", v) is None


class TestQuoted:
    @pytest.mark.parametrize(
        ("value", "literal"),
        [
            ('r"q', '"r\\"q"'),
            ("a\\b", '"a\\\\b"'),
            ("\b\f\n\r\t", '"\\b\\f\\n\\r\\t"'),
            ("\x00\x1f", '"\\u0000\\u001f"'),
            ("\x7f\x85\x9f", '"\\u007f\\u0085\\u009f"'),
            ("\u2028\u2029", '"\\u2028\\u2029"'),
            ("\u200b\u202e\u2066", '"\\u200b\\u202e\\u2066"'),
            ("\u00a0\u3000 ", '"\\u00a0\\u3000 "'),
            ("\U000e0061", '"\\udb40\\udc61"'),
            ("caf\u00e9 \u041e", '"caf\u00e9 \u041e"'),
            ("\u2764\ufe0f cats", '"\u2764\ufe0f cats"'),
            ("\U0001f469\u200d\U0001f4bb", '"\U0001f469\u200d\U0001f4bb"'),
            ("1\ufe0f\u20e3", '"1\\ufe0f\u20e3"'),
            ("\U0001f3f4\U000e0067\U000e007f", '"\U0001f3f4\\udb40\\udc67\\udb40\\udc7f"'),
            ("\ud800", '"\\ud800"'),
            ("\U0001d11e", '"\U0001d11e"'),
        ],
    )
    def test_examples(self, value: str, literal: str) -> None:
        """quoted writes JSON.stringify's literal, then escapes risky characters outside emoji sequences."""
        assert quoted(value) == literal

    def test_escapes_are_lowercase_hex(self) -> None:
        """Every \\uXXXX escape is written in lowercase hex."""
        assert quoted("\u00ad\ufeff\u3164") == '"\\u00ad\\ufeff\\u3164"'

    def test_separate_surrogate_pair_reads_back_joined(self) -> None:
        """A high-low surrogate pair held as two code points reads back as the one character it spells."""
        assert quoted("\ud83d\ude00") == '"\\ud83d\\ude00"'
        assert json.loads(quoted("\ud83d\ude00")) == "\U0001f600"

    @given(any_text)
    @example("\ufe0f")
    @example("\U000e0061")
    def test_round_trips_through_json(self, value: str) -> None:
        """json.loads of a quoted value gives the original string back."""
        assert json.loads(quoted(value)) == value

    @given(st.text(st.characters(codec=None, categories=["Cs", "Cf", "Zs", "Cc", "Lo"])))
    def test_round_trips_with_lone_surrogates(self, value: str) -> None:
        """Lone surrogates become escapes that json.loads reads back."""
        assume(no_paired_surrogates(value))
        assert json.loads(quoted(value)) == value

    @given(any_text)
    def test_only_emoji_keep_unseen_characters(self, value: str) -> None:
        """A quoted value is one line with no raw control, and its unseen characters all sit inside emoji sequences."""
        literal = quoted(value)
        assert literal.splitlines() == [literal]
        assert not any(_unseen(c) or c in _LINE_BREAKING for c in _EMOJI.sub("", literal))


class TestHeaderValue:
    @pytest.mark.parametrize(
        "value",
        ["discord", "discord:g1:room", "caf\u00e9", "\u041e\u0431\u0441\u0443\u0436\u0434\u0435\u043d\u0438\u0435",
         "a/b", "a /b", "t 1", "\u2764\ufe0f cats", "\U0001f469\u200d\U0001f4bb devs", "\U0001f44d\U0001f3fd ok",
         "#room (Guild One)", "\U0001d11e", ""],
    )
    def test_plain_values_stay(self, value: str) -> None:
        """Values with nothing structural or unseen outside emoji are written as they are."""
        assert header_value(value) == value

    @pytest.mark.parametrize(
        "value",
        ["x / y", "a]b", "[x", "a\u00b7b", 'r"q', "a\\b", "a\nb", "a\x85b", "a\u2028b", "\u200bx",
         "\u3164x", "\u034fx", "\ufe0fx", "\ufff9x", "\u202eevil", "\u2066x\u2069", "no\u00a0break",
         "ideo\u3000space", "a\u200db", "\U000e0041", "1\ufe0f\u20e3", "\U0001f3f4\U000e0067\U000e007f",
         "lone\ud800"],
    )
    def test_risky_values_are_quoted(self, value: str) -> None:
        """Structural characters, unseen characters outside emoji, keycaps, tag flags and lone surrogates are quoted."""
        assert header_value(value) == quoted(value)

    @given(any_text)
    @example("a /")
    @example("\u2764\ufe0f\u200b")
    def test_agrees_with_oracle(self, value: str) -> None:
        """A value is quoted exactly when the oracle from docs/provenance.md's definitions says it must be."""
        expected = quoted(value) if oracle_needs_quotes(value) else value
        assert header_value(value) == expected

    @given(any_text)
    def test_decodes_back(self, value: str) -> None:
        """The written value reads back as the original, quoted or not."""
        written = header_value(value)
        assert (json.loads(written) if written != value else written) == value

    @given(any_text)
    @example('"already quoted"')
    def test_classification_is_stable(self, value: str) -> None:
        """A plain value stays plain when written again; a quoted one is quoted again, never passed off as a literal."""
        written = header_value(value)
        if written == value:
            assert header_value(written) == written
        else:
            assert header_value(written) == quoted(written)


class TestLabelValue:
    @pytest.mark.parametrize(
        "label",
        ["Thread Topic-A", " reply  to z0", "thread", "unscoped", "\u200bthread x", "THREAD", "tHrEaD x",
         "reply to", "reply\u00a0to x", "Unscoped stuff", "\u3164thread", "\u034fthread", "\ufe0fthread",
         "\ufff9unscoped", "thread\u200b x"],
    )
    def test_header_words_are_quoted(self, label: str) -> None:
        """A label starting with a header word (any ASCII case, invisible characters aside) is quoted."""
        assert label_value(label) == quoted(label)

    @pytest.mark.parametrize(
        "label",
        ["threads", "thread-ideas", "thread:ops", "design thread", "reply tones", "unscopedness", "replyto x",
         "un\u017fcoped", "\uff34hread x", "stream design", "#room (Guild One)"],
    )
    def test_near_misses_stay(self, label: str) -> None:
        """Words that run on, come later, or only fold to a header word outside ASCII are not the header's."""
        assert label_value(label) == label

    def test_other_risks_follow_header_value(self) -> None:
        """A label without a header word is quoted by header_value's rule."""
        assert label_value("a \u00b7 b") == '"a \u00b7 b"'

    @given(st.sampled_from(["thread", "reply to", "unscoped"]), st.sampled_from([*INVISIBLES, *SPACES, " "]),
           st.text())
    def test_header_word_then_space_is_always_quoted(self, word: str, gap: str, rest: str) -> None:
        """A header word, then whitespace (invisible characters aside), is quoted whatever follows."""
        label = f"{word}{gap} {rest}"
        assert label_value(label) == quoted(label)

    @given(any_text)
    def test_never_less_quoted_than_header_value(self, label: str) -> None:
        """A label is quoted whenever header_value would quote it."""
        if header_value(label) != label:
            assert label_value(label) == quoted(label)

    @given(st.sampled_from(EMOJI_SEQUENCES[:7]), st.text(alphabet="abc ", max_size=5))
    def test_emoji_names_stay(self, emoji: str, rest: str) -> None:
        """Names holding emoji sequences (not keycaps or tag flags) are written as they are."""
        label = f"{emoji}{rest}x"
        assert label_value(label) == label
