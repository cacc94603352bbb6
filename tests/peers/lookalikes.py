"""The lookalike oracle and hostile text strategies, shared by tests/peers and tests/agents."""

from __future__ import annotations

import functools

import regex
from hypothesis import strategies as st

from mcplhost.peers.envelope import CLOSE_TAG, OPEN_TAG
from tests.inbound.confusables import readings
from tests.inbound.confusables import table as confusables_table
from tests.inbound.strategies import CONTROLS, INVISIBLES, LINE_SEPARATORS, SPACES

# The oracle, written from docs/peers.md's words with a plain scan: a lookalike is a character that reads as `<`,
# then optionally one that reads as `/`, then characters that read as the letters of `mcpl_agent_message`, with any
# run of ignorables (whitespace, Cc, Cf, Default_Ignorable_Code_Point) between. What a character reads as is
# ICU's word (docs/provenance.md §4a, tests/inbound/confusables.py).
_IGNORABLE = regex.compile(
    r"[\t\n\x0b\x0c\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
    r"\p{Cc}\p{Cf}\p{Default_Ignorable_Code_Point}]"
)
NAME = "mcpl_agent_message"


def _skip_ignorables(text: str, at: int) -> int:
    while at < len(text) and _IGNORABLE.fullmatch(text[at]):
        at += 1
    return at


def oracle_lookalikes(text: str) -> list[int]:
    """Positions of the `<` of every lookalike tag in `text` (slow, simple)."""
    found = []
    for start, char in enumerate(text):
        if "<" not in readings(char):
            continue
        at = _skip_ignorables(text, start + 1)
        if at < len(text) and "/" in readings(text[at]):
            at += 1
        for letter in NAME:
            at = _skip_ignorables(text, at)
            if at == len(text) or letter not in readings(text[at]):
                break
            at += 1
        else:
            found.append(start)
    return found


def oracle_neutralise(text: str) -> str:
    """`text` with a backslash inserted before each oracle lookalike that has none directly before it."""
    out, last = [], 0
    for at in oracle_lookalikes(text):
        if at == 0 or text[at - 1] != "\\":
            out += [text[last:at], "\\"]
            last = at
    return "".join(out) + text[last:]


# Ignorables of every kind.
IGNORABLES = [" ", "\n", *CONTROLS, *INVISIBLES, *SPACES, *LINE_SEPARATORS]


#: What a gap between a tag's characters may hold: one ignorable, or two of different kinds.
IGNORABLE_RUNS = [*IGNORABLES, *(a + b for a, b in zip(IGNORABLES, reversed(IGNORABLES), strict=True))]


@functools.cache
def forms(char: str) -> st.SearchStrategy[str]:
    """Any other character that reads as `char` by ICU's confusables data: its upper case, or a confusable."""
    return st.sampled_from([c for c in dict.fromkeys([char.upper(), *confusables_table()[char]]) if c != char])


@st.composite
def lookalikes(draw: st.DrawFn) -> str:
    """A lookalike tag in any of its forms, ignorables spliced in; sometimes cut short, so no longer one.

    Which characters take another form, and which gaps hold ignorables, are each one integer drawn as a bit
    mask (0: the plain tag, what a failure shrinks to): a tag costs a draw per changed character or filled gap,
    not several per character, and the properties that use it draw thousands of tags.
    """
    chars = ["<", "/", *NAME] if draw(st.booleans()) else ["<", *NAME]
    changed = draw(st.integers(0, 2 ** len(chars) - 1))
    filled = draw(st.integers(0, 2 ** (len(chars) - 1) - 1))  # the gap after each character but the last
    out = []
    for index, char in enumerate(chars):
        out.append(draw(forms(char)) if changed >> index & 1 else char)
        if filled >> index & 1:
            out.append(draw(st.sampled_from(IGNORABLE_RUNS)))
    text = "".join(out)
    return text[:draw(st.integers(0, len(text)))] if draw(st.booleans()) else text


# Text that leans on the tag: its pieces, whole lookalikes, ignorables, other `<` and `/` forms, any text.
TAG_PIECES = ["<", "</", "\uff1c", "\ufe64", "/", "\uff0f", "\\", ">", "mcpl_agent_message", "MCPL_Agent_Message",
              "mcpl", "_agent", "_message", "\u017f", "K", "\u00df", OPEN_TAG, CLOSE_TAG, "<\\/", "\\u003c",
              '"', "[source: x]", *"mcplagentsMCPLAGENTS_"]
tag_text = st.lists(st.sampled_from(TAG_PIECES + IGNORABLES) | lookalikes() | st.text(), max_size=20).map("".join)
