"""Hypothesis strategies for inbound text: the characters that break headers.

Generated text leans on what docs/provenance.md cares about: the header's own
grammar characters, controls, line separators, bidi and zero-width
characters, non-ASCII spaces, emoji sequences (ZWJ sequences, keycaps, tag
flags), astral characters, and header-shaped text, mixed with arbitrary text.
"""

from __future__ import annotations

from hypothesis import strategies as st

GRAMMAR = ["[", "]", "\u00b7", "/", '"', "\\", ":", " / ", " \u00b7 "]
CONTROLS = ["\t", "\n", "\r", "\x00", "\x0b", "\x1b", "\x1f", "\x7f", "\x85", "\x9f"]
LINE_SEPARATORS = ["\u2028", "\u2029"]
INVISIBLES = [
    "\u200b",  # zero width space
    "\u200c",  # zero width non-joiner
    "\u200d",  # zero width joiner, outside an emoji here
    "\u2060",  # word joiner
    "\ufeff",  # byte order mark
    "\u00ad",  # soft hyphen
    "\u034f",  # combining grapheme joiner (default-ignorable, not Cf)
    "\u3164",  # hangul filler (default-ignorable letter)
    "\ufff9",  # interlinear annotation anchor
    "\u202e",  # right-to-left override
    "\u2066",  # left-to-right isolate
    "\u2069",  # pop directional isolate
    "\u061c",  # arabic letter mark
    "\ufe0f",  # a variation selector on its own
    "\ufe0e",
    "\U000e0061",  # tag latin small letter a
    "\U000e007f",  # cancel tag
]
SPACES = ["\u00a0", "\u1680", "\u2003", "\u202f", "\u205f", "\u3000"]
EMOJI_SEQUENCES = [
    "\u2764\ufe0f",  # red heart with presentation selector
    "\U0001f44d\U0001f3fd",  # thumbs up, medium skin tone
    "\U0001f469\u200d\U0001f4bb",  # woman technologist (ZWJ)
    "\U0001f3f3\ufe0f\u200d\U0001f308",  # rainbow flag
    "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # family
    "\U0001f431",
    "\u00a9\ufe0f",
    "#\ufe0f\u20e3",  # keycap: not an emoji sequence under docs/provenance.md's rule
    "1\ufe0f\u20e3",
    "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",  # tag flag
]
WORDS = ["thread", "Thread ", "reply to ", "reply  to", "unscoped", "source", "S", "\u017f", "\u212a", "x"]
ASTRAL = ["\U0001d11e", "\U00020000", "\U0010fffd"]

RISKY_PIECES = GRAMMAR + CONTROLS + LINE_SEPARATORS + INVISIBLES + SPACES + EMOJI_SEQUENCES + WORDS + ASTRAL

# Header-shaped text a sender might type to forge an attribution.
header_shaped = st.from_regex(
    r"\[source: [a-z]{1,6}( / [a-z0-9:]{1,10})?( \u00b7 [#a-z ]{1,8})?( \u00b7 thread [a-z0-9]{1,4})?\]",
    fullmatch=True,
)

risky_piece = st.one_of(
    st.sampled_from(RISKY_PIECES),
    header_shaped,
    st.text(max_size=3),
)

# Text built from risky pieces; arbitrary text is mixed in through st.text().
risky_text = st.lists(risky_piece, max_size=12).map("".join)

any_text = st.one_of(st.text(), risky_text)

# Openings and near-misses, with ignorables, case variants and ſ inside.
opening_like = st.from_regex(
    r"\\?\[{1,2}[ \t\u200b\u00ad\x00\u2060]{0,2}[sS\u017f\uff53]?[ \u200b]?[oO][uU]?[rR]"
    r"[\u200d\ufeff]?[cC][eE]?s?[ \u034f]?[:\]\-x ]?( x\])?",
    fullmatch=True,
)

# Text dense in openings, near-misses and the characters around them.
marking_text = st.lists(
    st.one_of(
        opening_like,
        st.sampled_from(
            ["[", "\\", "[source:", "[source]", "source:", "]", ":", "\u200b", " ", "\U0001f431", "\u017f"]
        ),
        risky_piece,
    ),
    max_size=10,
).map("".join)

image_block = st.builds(lambda d: {"type": "image", "data": d, "mimeType": "image/png"}, st.text(max_size=4))
text_block = st.builds(lambda t: {"type": "text", "text": t}, marking_text)

# Content blocks as mark_openings receives them: text, with images between.
blocks = st.lists(st.one_of(text_block, text_block, image_block), max_size=6)
