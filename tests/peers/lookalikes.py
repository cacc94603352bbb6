"""The lookalike oracle and hostile text strategies, shared by tests/peers and tests/agents."""

from __future__ import annotations

import regex
from hypothesis import strategies as st

from mcplhost.peers.envelope import CLOSE_TAG, OPEN_TAG
from tests.inbound.strategies import CONTROLS, INVISIBLES, LINE_SEPARATORS, SPACES

# The oracle, written from docs/peers.md's words with a plain scan: a lookalike is a form of `<`, then
# optionally a form of `/`, then the letters of `mcpl_agent_message` each equal to its letter once
# case-folded, with any run of ignorables (whitespace, Cc, Cf, Default_Ignorable_Code_Point) between.
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
        if char not in "<\uff1c\ufe64":
            continue
        at = _skip_ignorables(text, start + 1)
        if at < len(text) and text[at] in "/\uff0f":
            at += 1
        for letter in NAME:
            at = _skip_ignorables(text, at)
            if at == len(text) or text[at].casefold() != letter:
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


# Ignorables of every kind, and the letters of the name as case folding lets them be written.
IGNORABLES = [" ", "\n", *CONTROLS, *INVISIBLES, *SPACES, *LINE_SEPARATORS]


def _letter_forms(letter: str) -> list[str]:
    return [letter, letter.upper(), *(["\u017f"] if letter == "s" else [])]


@st.composite
def lookalikes(draw: st.DrawFn) -> str:
    """A lookalike tag in any of its forms, ignorables spliced in; sometimes cut short, so no longer one."""
    spliced = st.lists(st.sampled_from(IGNORABLES), max_size=2).map("".join)
    out = [draw(st.sampled_from(["<", "\uff1c", "\ufe64"])), draw(spliced)]
    if draw(st.booleans()):
        out += [draw(st.sampled_from(["/", "\uff0f"])), draw(spliced)]
    for index, letter in enumerate(NAME):
        out += [draw(spliced) if index else "", draw(st.sampled_from(_letter_forms(letter)))]
    text = "".join(out)
    return text[:draw(st.integers(0, len(text)))] if draw(st.booleans()) else text


# Text that leans on the tag: its pieces, whole lookalikes, ignorables, other `<` and `/` forms, any text.
TAG_PIECES = ["<", "</", "\uff1c", "\ufe64", "/", "\uff0f", "\\", ">", "mcpl_agent_message", "MCPL_Agent_Message",
              "mcpl", "_agent", "_message", "\u017f", "K", "\u00df", OPEN_TAG, CLOSE_TAG, "<\\/", "\\u003c",
              '"', "[source: x]", *"mcplagentsMCPLAGENTS_"]
tag_text = st.lists(st.sampled_from(TAG_PIECES + IGNORABLES) | lookalikes() | st.text(), max_size=20).map("".join)
