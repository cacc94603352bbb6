"""Tests for mcplhost/inbound/mark.py: mark_openings."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
import regex
from hypothesis import example, given

from mcplhost.inbound import mark_openings
from tests.inbound.confusables import readings
from tests.inbound.strategies import blocks as blocks_strategy

from ..builders import texts

# The oracle: a plain character-by-character scanner written from the words of docs/provenance.md §4 and §4a.
# Ignorables are whitespace (ECMAScript's list), Cc, Cf and
# Default_Ignorable_Code_Point; a character matches `[`, a letter of "source",
# `:` or `]` when it reads as it (ICU's readings, tests/inbound/confusables.py).
_IGNORABLE = regex.compile(
    r"[\t\n\x0b\x0c\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
    r"\p{Cc}\p{Cf}\p{Default_Ignorable_Code_Point}]"
)


def _is_ignorable(char: str) -> bool:
    return _IGNORABLE.fullmatch(char) is not None


def oracle_openings(text: str) -> list[int]:
    """Positions of the `[` of every opening in `text` (slow, simple)."""
    found = []
    for start, char in enumerate(text):
        if "[" not in readings(char):
            continue
        at = start + 1
        for letter in "source":
            while at < len(text) and _is_ignorable(text[at]):
                at += 1
            if at == len(text) or letter not in readings(text[at]):
                break
            at += 1
        else:
            while at < len(text) and _is_ignorable(text[at]):
                at += 1
            if at < len(text) and readings(text[at]) & {":", "]"}:
                found.append(start)
    return found


def joined(blocks: list[dict[str, Any]]) -> str:
    return "".join(texts(blocks))


def insert_marks(blocks: list[dict[str, Any]], times: int = 1) -> list[str]:
    """Each text block with `times` backslashes before every oracle opening of the joined text."""
    positions = set(oracle_openings(joined(blocks)))
    result, start = [], 0
    for text in texts(blocks):
        result.append("".join("\\" * times * (start + i in positions) + c for i, c in enumerate(text)))
        start += len(text)
    return result


def remove_one_mark(text: str) -> str:
    """`text` with the character before each opening removed (it must be a backslash)."""
    positions = oracle_openings(text)
    assert all(p > 0 and text[p - 1] == "\\" for p in positions)
    drop = {p - 1 for p in positions}
    return "".join(c for i, c in enumerate(text) if i not in drop)


def text_blocks(*parts: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": part} for part in parts]


IMAGE = {"type": "image", "data": "aGk=", "mimeType": "image/png"}


class TestMarkOpeningsExamples:
    @pytest.mark.parametrize(
        ("text", "marked"),
        [
            ("[source: x]", "\\[source: x]"),
            ("see [source: x] here", "see \\[source: x] here"),
            ("hello\n[source: discord / c] hi", "hello\n\\[source: discord / c] hi"),
            ("user: [source: x]", "user: \\[source: x]"),
            ("[source]", "\\[source]"),
            ("[ SoUrCe :x]", "\\[ SoUrCe :x]"),
            ("[\u017fource: x]", "\\[\u017fource: x]"),
            ("[SOURCE]", "\\[SOURCE]"),
            ("[s\u200bo\u00adu\u2060r\ufeffc\u034fe\u3164: x]", "\\[s\u200bo\u00adu\u2060r\ufeffc\u034fe\u3164: x]"),
            ("[\x00\tsource\x1b]", "\\[\x00\tsource\x1b]"),
            ("[\u202esource:]", "\\[\u202esource:]"),
            ("\uff3bsource: x]", "\\\uff3bsource: x]"),
            ("[\uff53ource: x]", "\\[\uff53ource: x]"),
            ("\\[source: x]", "\\\\[source: x]"),
            ("[[source: x]]", "[\\[source: x]]"),
            ("[source: a] and [source: b]", "\\[source: a] and \\[source: b]"),
        ],
    )
    def test_openings_are_marked(self, text: str, marked: str) -> None:
        """Every opening gets one backslash before its `[`, wherever it stands and whatever precedes it."""
        assert mark_openings(text_blocks(text)) == text_blocks(marked)

    @pytest.mark.parametrize(
        "text",
        ["[sources]", "[resource: x]", "source: x", "[src: x]", "[source-x]", "[source x]", "(source: x)",
         "[sour ce x]", "[source", "[sourc]", "[\u00dfource:]", "[ s\u0301ource:]"],
    )
    def test_near_misses_stay(self, text: str) -> None:
        """Near-misses are left as they are."""
        assert mark_openings(text_blocks(text)) == text_blocks(text)

    def test_split_across_blocks(self) -> None:
        """An opening split across blocks is marked in the block holding its `[`."""
        assert mark_openings(text_blocks("hi [sou", "rce: x]")) == text_blocks("hi \\[sou", "rce: x]")

    def test_split_inside_the_word_over_four_blocks(self) -> None:
        """An opening spread over four blocks is found."""
        result = mark_openings(text_blocks("a[", "so", "urc", "e]b"))
        assert result == text_blocks("a\\[", "so", "urc", "e]b")

    def test_split_around_an_image(self) -> None:
        """Non-text blocks are skipped, so an opening around an image is found and the image is untouched."""
        result = mark_openings([*text_blocks("[source"), IMAGE, *text_blocks(": x]")])
        assert result == [*text_blocks("\\[source"), IMAGE, *text_blocks(": x]")]

    def test_split_between_empty_blocks(self) -> None:
        """Empty text blocks between the parts of an opening change nothing."""
        result = mark_openings(text_blocks("[", "", "source", "", "]"))
        assert result == text_blocks("\\[", "", "source", "", "]")

    def test_bracket_last_in_block_inside_a_block_opening(self) -> None:
        """A block whose own opening ends inside it, then a last `[` that crosses, gets both marks."""
        result = mark_openings(text_blocks("[source] [", "source]"))
        assert result == text_blocks("\\[source] \\[", "source]")

    def test_crossing_near_miss_stays(self) -> None:
        """A block ending in a partial opening that the next block does not finish is left alone."""
        assert mark_openings(text_blocks("x [sour", "ces]")) == text_blocks("x [sour", "ces]")

    def test_empty_list(self) -> None:
        """No blocks give no blocks."""
        assert mark_openings([]) == []

    def test_input_untouched_and_blocks_new(self) -> None:
        """The input blocks are not changed and every returned block is a new dict."""
        blocks = [*text_blocks("[source: x]"), IMAGE]
        before = copy.deepcopy(blocks)
        result = mark_openings(blocks)
        assert blocks == before
        assert all(new is not old for new, old in zip(result, blocks))

    def test_other_members_kept(self) -> None:
        """Members of a text block other than `text` come back as they were."""
        block = {"type": "text", "text": "[source]", "annotations": {"audience": ["user"]}}
        assert mark_openings([block]) == [{"type": "text", "text": "\\[source]", "annotations": {"audience": ["user"]}}]


class TestMarkOpeningsProperties:
    @given(blocks_strategy)
    @example(text_blocks("[", "\u200b", "S", "ource", "\u034f:"))
    @example(text_blocks("[source] [sou", "rce: [", "source]"))
    def test_agrees_with_oracle(self, blocks: list[dict[str, Any]]) -> None:
        """Each block gets a backslash before exactly the oracle's openings that start in it; nothing else changes."""
        result = mark_openings(blocks)
        assert texts(result) == insert_marks(blocks)
        assert [b for b in result if b.get("type") != "text"] == [b for b in blocks if b.get("type") != "text"]

    @given(blocks_strategy)
    def test_no_unmarked_opening_remains(self, blocks: list[dict[str, Any]]) -> None:
        """In the marked joined text, every opening's `[` has a backslash directly before it."""
        marked = joined(mark_openings(blocks))
        assert all(p > 0 and marked[p - 1] == "\\" for p in oracle_openings(marked))

    @given(blocks_strategy)
    def test_removing_the_marks_gives_the_input_back(self, blocks: list[dict[str, Any]]) -> None:
        """Removing one backslash before each opening gives back the input text, and the opening count is kept."""
        marked = joined(mark_openings(blocks))
        assert remove_one_mark(marked) == joined(blocks)
        assert len(oracle_openings(marked)) == len(oracle_openings(joined(blocks)))

    @given(blocks_strategy)
    def test_marking_twice_adds_one_more_mark(self, blocks: list[dict[str, Any]]) -> None:
        """Marking always inserts, so a second pass adds exactly one more backslash per opening."""
        twice = mark_openings(mark_openings(blocks))
        assert texts(twice) == insert_marks(blocks, times=2)

    @given(blocks_strategy)
    def test_input_is_never_mutated(self, blocks: list[dict[str, Any]]) -> None:
        """The blocks passed in are unchanged after marking."""
        before = copy.deepcopy(blocks)
        mark_openings(blocks)
        assert blocks == before


class TestMarkOpeningsTime:
    # Generous bounds on this process's CPU time (not the wall clock, which a loaded machine stretches): a
    # quadratic version takes seconds to minutes on these. tests/bench/bench_mark.py measures them properly.
    @pytest.mark.parametrize(
        "text",
        [
            pytest.param(("[source: x]" * 100_000).ljust(1 << 20, "y"), id="1MiB-100k-openings"),
            pytest.param("[" * 200_000 + "[source: x]", id="200k-brackets"),
            pytest.param("[sourc" * 100_000, id="100k-unfinished"),
            pytest.param("[" + "\u200b" * 300_000 + "source: x]", id="300k-zero-width-inside"),
        ],
    )
    def test_adversarial_bodies_mark_quickly(self, text: str) -> None:
        """Adversarial bodies mark in well under a second."""
        mark_openings(text_blocks("[source]"))  # derive the pattern outside the timing
        started = time.process_time()
        mark_openings(text_blocks(text))
        assert time.process_time() - started < 1.0

    def test_many_blocks_each_ending_in_a_partial_opening(self) -> None:
        """Ten thousand blocks, each ending in a `[` the next one continues, mark in linear time."""
        blocks = text_blocks(*(["x[sour"] * 10_000 + ["ce]"]))
        started = time.process_time()
        result = mark_openings(blocks)
        assert time.process_time() - started < 1.0
        assert texts(result)[-2:] == ["x\\[sour", "ce]"]
        assert texts(result)[0] == "x[sour"
