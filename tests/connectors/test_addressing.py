"""mcplhost/connectors/addressing.py: which names a body addresses (docs/agents.md#addressing).

The rule against a plain oracle that walks the text character by character,
and the cases a person would write.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mcplhost.connectors.addressing import addressed_names

NAMES = ["ada", "Bob", "ada-bot", "c_3"]


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


def oracle(text: str, names: list[str]) -> list[str]:
    """The rule read naively: try every `@` and the body's start, for each name."""
    found = []
    for name in names:
        size = len(name)
        hit = False
        stripped = text.lstrip()  # str.lstrip and \s agree on what whitespace is
        head = stripped[:size]
        if head.isascii() and head.lower() == name.lower() and stripped[size:size + 1] in (":", ","):
            hit = True
        for at, char in enumerate(text):
            if hit:
                break
            if char != "@" or (at and (_word(text[at - 1]) or text[at - 1] == "@")):
                continue
            word = text[at + 1:at + 1 + size]
            after = text[at + 1 + size:at + 2 + size]
            if word.isascii() and word.lower() == name.lower() and not (after and (_word(after) or after == "-")):
                hit = True
        if hit:
            found.append(name)
    return found


class TestRule:
    @pytest.mark.parametrize(("text", "expected"), [
        ("@ada please", ["ada"]),
        ("thanks @ADA.", ["ada"]),
        ("ada: look", ["ada"]),
        ("  Bob, look", ["Bob"]),
        ("@ada and @bob", ["ada", "Bob"]),
        ("@ada-bot hi", ["ada-bot"]),      # the whole word: ada-bot, not ada
        ("@adam hi", []),
        ("mail ada@example.org", []),     # glued to a word: an address, not a mention
        ("ask ada: later", []),           # NAME: only at the start
        ("ada! hi", []),
        ("@@ada", []),
        ("@adaé", []),                    # a word character (any script) after the name: another word
        ("", []),
    ])
    def test_cases(self, text: str, expected: list[str]) -> None:
        assert addressed_names(text, NAMES) == expected

    @given(st.text(alphabet=st.sampled_from(list("@ada Bob,:-_3cé.\n\tx")), max_size=40))
    @example("ada,@ada")
    @example("\u00a0ada:")
    def test_agrees_with_the_naive_reading(self, text: str) -> None:
        assert addressed_names(text, NAMES) == oracle(text, NAMES)

    @given(st.text(max_size=60))
    def test_a_name_is_addressed_only_where_its_letters_stand(self, text: str) -> None:
        """Whatever the text, every name found is in it (without case), and the answer keeps the names' order."""
        found = addressed_names(text, NAMES)
        assert all(name.lower() in text.lower() for name in found)
        assert found == [name for name in NAMES if name in found]
