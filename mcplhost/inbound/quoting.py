"""How a connector's value is written into a header: as it is, or quoted.

docs/provenance.md §3 "Value quoting". A value is left as it is only when a
reader cannot mistake any part of it for the header's own grammar and cannot
be shown something other than what it holds; otherwise it becomes a JSON
string literal whose risky characters are visible escapes.
"""

from __future__ import annotations

from functools import lru_cache
from json.encoder import encode_basestring as _json_string_literal

import regex

from mcplhost.inbound.patterns import (
    EMOJI_SEQUENCE_RE,
    INVISIBLE_RE,
    LABEL_HEADER_WORD_RE,
    QUOTE_ESCAPE_RE,
    STRUCTURAL_RE,
    UNSEEN_RE,
)

__all__ = ["header_value", "label_value", "quoted"]


def _utf16_escapes(char: str) -> str:
    """`\\uXXXX` per UTF-16 code unit, lowercase hex (astral: two escapes)."""
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _escape_outside_emoji(match: regex.Match[str]) -> str:
    if match.group("emoji") is not None:
        return match.group()
    return "".join(map(_utf16_escapes, match.group()))


def quoted(v: str) -> str:
    """`v` as a JSON string literal with every risky character escaped visibly.

    First the literal ECMAScript `JSON.stringify` writes (escape `"` and `\\`,
    `\\b \\f \\n \\r \\t`, other U+0000–U+001F as `\\u00xx`, everything else
    literal: the stdlib's non-ASCII encoder does exactly this), then, outside
    emoji sequences, U+007F–U+009F, U+2028, U+2029, invisible characters,
    non-U+0020 spaces and lone surrogates become `\\uXXXX` escapes.

    `json.loads(quoted(v)) == v` for every `v` except one that holds a high
    surrogate directly followed by a low one as two code points: JSON has no
    spelling for that string, and json.loads joins the pair into one
    character (as ECMAScript would).
    """
    return QUOTE_ESCAPE_RE.sub(_escape_outside_emoji, _json_string_literal(v))


def _needs_quotes(v: str) -> bool:
    if STRUCTURAL_RE.search(v) is not None:
        return True
    return UNSEEN_RE.search(EMOJI_SEQUENCE_RE.sub("", v)) is not None


#: Values up to this many characters are remembered: connector names, channel
#: ids and labels repeat on every item, and a longer value is rare and costly to keep.
CACHED_VALUE_CHARS = 256
#: How many distinct short values are remembered, per function.
CACHED_VALUES = 8192


def header_value(s: str) -> str:
    """`s` as it is, or `quoted(s)` when it has a structural or unseen character.

    Unseen characters inside an emoji sequence (a ZWJ, a variation selector)
    do not count, so `❤️ cats` stays as it is; a keycap or a tag flag is not
    such a sequence and is quoted.
    """
    return _header_value_cached(s) if len(s) <= CACHED_VALUE_CHARS else _header_value(s)


def _header_value(s: str) -> str:
    return quoted(s) if _needs_quotes(s) else s


def label_value(s: str) -> str:
    """A channel label: quoted also when it starts with one of the header's words.

    A label reading `thread x`, `reply to x` or `unscoped` (any ASCII case,
    any invisible characters in front or between) would pass for the header's
    own thread, reply or unscoped part, so it is quoted; `threads`,
    `thread:ops` and `design thread` are not the header's words.
    """
    return _label_value_cached(s) if len(s) <= CACHED_VALUE_CHARS else _label_value(s)


def _label_value(s: str) -> str:
    if LABEL_HEADER_WORD_RE.search(INVISIBLE_RE.sub("", s)) is not None:
        return quoted(s)
    return _header_value(s)


_header_value_cached = lru_cache(maxsize=CACHED_VALUES)(_header_value)
_label_value_cached = lru_cache(maxsize=CACHED_VALUES)(_label_value)


def forget_quoted_values() -> None:
    """Empty the caches of quoted values, so the next render pays a first sight (tests/bench/bench_header.py)."""
    _header_value_cached.cache_clear()
    _label_value_cached.cache_clear()
