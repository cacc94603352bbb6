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


# Text that leans on the tag: its pieces, its letters in other cases, ignorables, other `<` and `/` forms.
TAG_PIECES = ["<", "</", "\uff1c", "\ufe64", "/", "\uff0f", "\\", ">", "mcpl_agent_message", "MCPL_Agent_Message",
              "mcpl", "_agent", "_message", "\u017f", "K", "\u00df", OPEN_TAG, CLOSE_TAG, "<\\/", "\\u003c",
              '"', "[source: x]", *"mcplagentsMCPLAGENTS_"]
tag_text = st.lists(st.sampled_from(TAG_PIECES + CONTROLS + INVISIBLES + SPACES + LINE_SEPARATORS) | st.text(),
                    max_size=30).map("".join)
