"""The character classes and patterns of docs/provenance.md, in one place.

Every pattern here is built from small named pieces, each under the words of
the docs/provenance.md rule it implements, and compiled once (the way h11/_abnf.py
writes RFC 7230): at import, except the fast opening pattern, on first use. Unicode data always comes from the `regex`
package's property tables (``\\p{Cf}``, ``\\p{Default_Ignorable_Code_Point}``
and so on), and what a character reads as from mcplhost/inbound/lookalikes.py
(ICU's confusables data); the only lists written out by hand are the ones
docs/provenance.md itself spells out as definitions (the ECMAScript whitespace
set, the control ranges of "structural").

Two deliberate departures, each explained where it is made:

* lone surrogates (which a Python ``str`` can hold, a UTF-8 store cannot) are
  quoted and escaped like unseen characters;
* the opening pattern runs on the stdlib ``re`` engine, with the ignorable
  class derived from the ``regex`` tables on first use, because ``regex``
  is about three times slower on it and misses the 100 ms budget.
"""

from __future__ import annotations

import functools
import re
import sys
from array import array

import regex

from mcplhost.inbound.lookalikes import reads_as

# ---------------------------------------------------------------------------
# Character class bodies (the text between ``[`` and ``]``).
# ---------------------------------------------------------------------------

# docs/provenance.md#the-character-classes, whitespace: exactly the ECMAScript set,
# U+0009–U+000D, U+0020, U+00A0, U+1680, U+2000–U+200A, U+2028, U+2029, U+202F,
# U+205F, U+3000, U+FEFF. Python's and regex's own `\s` differ from it
# (U+001C–U+001F, U+0085), so nothing below uses them.
WHITESPACE = r"\t-\r\x20\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"

# docs/provenance.md#the-character-classes, invisible: General_Category Cf, or the
# property Default_Ignorable_Code_Point.
INVISIBLE = r"\p{Cf}\p{Default_Ignorable_Code_Point}"

# docs/provenance.md#the-character-classes, structural: `[` `]` `·` `"` `\`,
# U+0000–U+001F, U+007F–U+009F, U+2028, U+2029 ...
STRUCTURAL_CHAR = r'\[\]\u00b7"\\\x00-\x1f\x7f-\x9f\u2028\u2029'

# ... and a `/` with a whitespace character directly on each side.
SPACED_SLASH = rf"(?<=[{WHITESPACE}])/(?=[{WHITESPACE}])"

# docs/provenance.md#the-character-classes, unseen: an invisible character, or a
# General_Category Zs character other than U+0020.
OTHER_SPACE = r"(?!\x20)\p{Zs}"

# Departure: a Python str may hold a lone surrogate (json.loads makes one from
# "\ud800"). UTF-8 cannot store it, and ECMAScript's JSON.stringify writes it
# as a \uXXXX escape, so header_value quotes a value holding one and quoted()
# escapes it; json.loads then gives the same string back.
LONE_SURROGATE = r"\p{Cs}"

# docs/provenance.md §3, quoted: each of U+007F–U+009F, U+2028, U+2029, every
# invisible character and every Zs other than U+0020 is replaced by \uXXXX escapes.
ESCAPED_INSIDE_QUOTES = rf"[\x7f-\x9f\u2028\u2029{INVISIBLE}]|{OTHER_SPACE}|{LONE_SURROGATE}"

# docs/provenance.md#the-character-classes, ignorable (docs/provenance.md §4):
# whitespace, control characters (Cc) and invisible characters.
IGNORABLE = rf"[{WHITESPACE}\p{{Cc}}{INVISIBLE}]"

# ---------------------------------------------------------------------------
# Emoji sequences, exempt from the unseen rule.
# ---------------------------------------------------------------------------

# docs/provenance.md#the-character-classes, emoji sequence: an Extended_Pictographic
# character, optionally followed by one Emoji_Modifier or U+FE0E/U+FE0F, then any
# number of (U+200D, Extended_Pictographic, optional Emoji_Modifier or U+FE0E/U+FE0F).
MODIFIER_OR_SELECTOR = r"(?:\p{Emoji_Modifier}|[\ufe0e\ufe0f])"
PICTOGRAPH = rf"\p{{Extended_Pictographic}}{MODIFIER_OR_SELECTOR}?"
EMOJI_SEQUENCE = rf"{PICTOGRAPH}(?:\u200d{PICTOGRAPH})*"

# ---------------------------------------------------------------------------
# Header values (docs/provenance.md#writing-a-value-into-the-header).
# ---------------------------------------------------------------------------

# header_value (docs/provenance.md#writing-a-value-into-the-header): a value holding a
# structural character is quoted.
STRUCTURAL_RE = regex.compile(rf"[{STRUCTURAL_CHAR}]|{SPACED_SLASH}")

# So is one that, with every emoji sequence removed, ...
EMOJI_SEQUENCE_RE = regex.compile(EMOJI_SEQUENCE)

# ... still holds an unseen character (and, by the departure above, a lone
# surrogate).
UNSEEN_RE = regex.compile(rf"[{INVISIBLE}]|{OTHER_SPACE}|{LONE_SURROGATE}")

# quoted: the escapes apply outside emoji sequences, so a match of the
# first alternative is written back as it is.
QUOTE_ESCAPE_RE = regex.compile(rf"(?P<emoji>{EMOJI_SEQUENCE})|{ESCAPED_INSIDE_QUOTES}")

# label_value: the label with its invisible characters removed is what the header words are looked for in.
INVISIBLE_RE = regex.compile(rf"[{INVISIBLE}]")


def _ascii_caseless(word: str) -> str:
    """`word` matched with ASCII-only case-insensitivity, spelled out."""
    return "".join(f"[{c.lower()}{c.upper()}]" for c in word)


# label_value: quoted when that starts (after whitespace) with `thread`, `reply` +
# whitespace + `to`, or `unscoped`, then whitespace or the end, compared with ASCII-only
# case-insensitivity (no other Unicode case folding: `ſ` is not `s`). regex's IGNORECASE folds `ſ` to `s`, hence the spelled-out
# classes; `\Z` because ECMAScript's `$` (no m flag) never matches before a
# final newline, as Python's does.
HEADER_WORD = (
    rf"(?:{_ascii_caseless('thread')}"
    rf"|{_ascii_caseless('reply')}[{WHITESPACE}]+{_ascii_caseless('to')}"
    rf"|{_ascii_caseless('unscoped')})"
)
LABEL_HEADER_WORD_RE = regex.compile(rf"\A[{WHITESPACE}]*{HEADER_WORD}(?:[{WHITESPACE}]|\Z)")

# ---------------------------------------------------------------------------
# Visible content (docs/provenance.md §0, admission of a push).
# ---------------------------------------------------------------------------

# Text is empty when nothing is left once whitespace and invisible characters are set aside:
# one character outside both classes makes the text visible.
VISIBLE_CHAR_RE = regex.compile(rf"[^{WHITESPACE}{INVISIBLE}]")

# ---------------------------------------------------------------------------
# Openings (docs/provenance.md §4 and §4a: mark, and visible look-alikes).
# ---------------------------------------------------------------------------

# The letters `s o u r c e`, each any character that reads as it (mcplhost/inbound/lookalikes.py: under full
# Unicode case folding `S` and `ſ` count, and so do look-alikes such as Cyrillic `ѕ` and fullwidth `ｓ`).
SOURCE_LETTERS = "source"


def opening_pattern(ignorable: str, bracket: str | None = None) -> str:
    """The bracket of an opening (any that reads as `[`, or only `bracket`), with the rest checked by a lookahead.

    docs/provenance.md §4 and §4a: an opening is a character that reads as
    `[`, then any run of ignorables, then characters that read as the
    letters `s o u r c e`, with any run of ignorables allowed between them,
    then any run of ignorables, then a character that reads as `:` or `]`.

    Linear time: no character that reads as `[` is an ignorable or reads as
    a letter, `:` or `]` (tests/inbound/test_lookalikes.py), so the
    lookahead started at one bracket never reads past the next one; every
    character is read by at most one attempt.
    """
    first = reads_as("[") if bracket is None else re.escape(bracket)
    letters = "".join(f"{ignorable}*{reads_as(c)}" for c in SOURCE_LETTERS)
    return rf"{first}(?={letters}{ignorable}*{reads_as(':', ']')})"


# The reference pattern, with the `regex` property classes.
OPENING_RE = regex.compile(opening_pattern(IGNORABLE))


def _all_code_points() -> str:
    """Every code point, in order, as one string (built through UTF-32: fast)."""
    typecode = next(t for t in "IL" if array(t).itemsize == 4)
    points = array(typecode, range(sys.maxunicode + 1))
    codec = "utf-32-le" if sys.byteorder == "little" else "utf-32-be"
    return points.tobytes().decode(codec, "surrogatepass")


def _as_re_class(pattern: str, universe: str) -> str:
    """The code points `pattern` (one character) matches, as an `re` class."""
    ranges = []
    for run in regex.finditer(f"(?:{pattern})+", universe):
        first, last = run.group()[0], run.group()[-1]
        ranges.append(re.escape(first) if first == last else f"{re.escape(first)}-{re.escape(last)}")
    return "[" + "".join(ranges) + "]"


#: derived_ignorable_class's answer under the `regex` release named here, whose Unicode tables it was derived
#: from: a process with that release takes it as it is instead of reading every code point (about 0.15 s of CPU
#: on each start, and the suite starts hundreds of daemons); any other release derives it again.
#: tests/inbound/test_patterns.py checks it against the derivation; after an upgrade of `regex`, store the new
#: release's: `python -c 'from mcplhost.inbound.patterns import *; print(ascii(scanned_ignorable_class()))'`.
STORED_IGNORABLE_CLASS = ("2026.12.2", (
    '[\x00-\\ \x7f-\xa0\xad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u115f-\u1160'
    '\u1680\u17b4-\u17b5\u180b-\u180f\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\u3164\ufe00-\ufe0f'
    '\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3'
    '\U0001d173-\U0001d17a\U000e0000-\U000e0fff]'
))


def scanned_ignorable_class() -> str:
    """The ignorable class, as an `re` class, derived from the `regex` tables by reading every code point."""
    return _as_re_class(IGNORABLE, _all_code_points())


@functools.cache
def derived_ignorable_class() -> str:
    """The ignorable class, as an `re` class: `STORED_IGNORABLE_CLASS` under its release, else scanned.

    Scanning reads every code point once (about 0.1 s), so it happens on
    first use rather than at import.
    """
    release, stored = STORED_IGNORABLE_CLASS
    return stored if regex.__version__ == release else scanned_ignorable_class()


@functools.cache
def fast_opening_re(bracket: str | None = None) -> re.Pattern[str]:
    """OPENING_RE, compiled for the stdlib `re` engine; with `bracket`, only the openings that begin with it.

    On a 1 MiB body of 100,000 openings `regex` took 100–130 ms, `re` about
    a third of that. The ignorable class comes from `derived_ignorable_class`,
    so no range is written by hand and both patterns follow the same Unicode
    tables. A pattern that begins with one literal bracket is searched for
    with a fast literal scan; one that begins with a class reads every
    character (about 20 ms a megabyte).
    """
    return re.compile(opening_pattern(derived_ignorable_class(), bracket))
