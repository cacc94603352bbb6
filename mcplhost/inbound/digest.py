"""Canonical JSON and the body digests of docs/provenance.md §5.

`canonical_json` writes what an ECMAScript host would: object keys sorted by
UTF-16 code units, no whitespace, strings as `JSON.stringify` writes them,
numbers as `Number.prototype.toString` writes them, lone surrogates replaced
by U+FFFD. It runs on every inbound item, so strings go through the stdlib's
C string encoder and the only per-character work is done in C.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from json.encoder import encode_basestring as _json_string_literal
from typing import Any

import msgspec

__all__ = ["body_digest", "canonical_json", "ecmascript_number"]

# Integers below this are exactly representable, so their exact digits are
# also the shortest ones ECMAScript prints.
_EXACT_INTEGER_LIMIT = 2**53


def ecmascript_number(x: float) -> str:
    """`x` as ECMAScript's Number::toString writes it (non-finite: `null`, as JSON.stringify does)."""
    if not math.isfinite(x):
        return "null"
    if x == 0:
        return "0"  # also -0
    if x.is_integer() and abs(x) < _EXACT_INTEGER_LIMIT:
        return str(int(x))
    # repr gives the shortest digits that round-trip, as ECMAScript requires;
    # only the layout differs.
    sign, text = ("-", repr(-x)) if x < 0 else ("", repr(x))
    mantissa, _, exponent = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    all_digits = whole + fraction
    digits = all_digits.lstrip("0")
    # n: where the decimal point sits relative to the first significant digit.
    n = len(whole) + int(exponent or 0) - (len(all_digits) - len(digits))
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return f"{sign}{digits[:n]}.{digits[n:]}"
    if -6 < n <= 0:
        return f"{sign}0.{'0' * -n}{digits}"
    power = f"e+{n - 1}" if n >= 1 else f"e-{1 - n}"
    if k == 1:
        return sign + digits + power
    return f"{sign}{digits[0]}.{digits[1:]}{power}"


def _utf16_order(item: tuple[str, Any]) -> bytes:
    key = item[0]
    if not isinstance(key, str):
        raise TypeError(f"object keys must be strings, not {type(key).__name__}")
    # Big-endian UTF-16 bytes compare exactly as their code units do.
    return key.encode("utf-16-be", "surrogatepass")


def _write(x: Any, out: Callable[[str], None]) -> None:
    # Checked in order of how often each type occurs in content blocks; bool
    # before int, since True is an int.
    if isinstance(x, str):
        out(_json_string_literal(x))
    elif isinstance(x, dict):
        out("{")
        first = True
        for key, value in sorted(x.items(), key=_utf16_order):
            if not first:
                out(",")
            first = False
            out(_json_string_literal(key))
            out(":")
            _write(value, out)
        out("}")
    elif isinstance(x, (list, tuple)):
        out("[")
        for index, item in enumerate(x):
            if index:
                out(",")
            _write(item, out)
        out("]")
    elif x is None:
        out("null")
    elif isinstance(x, bool):
        out("true" if x else "false")
    elif isinstance(x, int):
        out(str(x))
    elif isinstance(x, float):
        out(ecmascript_number(x))
    else:
        raise TypeError(f"not a JSON value: {type(x).__name__}")


def _well_formed(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD.

    Only strings hold surrogates, and each string ends in `"`, so surrogates
    never pair across values; a high-low pair held as two code points is one
    character to ECMAScript and is joined here as well.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def canonical_json(x: Any) -> str:
    """`x` as canonical JSON text (see the module docstring).

    Keys are sorted as they were given (a key with a lone surrogate sorts by
    that surrogate's code unit, as ECMAScript sorts it) and written with the
    surrogate replaced.
    """
    pieces: list[str] = []
    _write(x, pieces.append)
    text = "".join(pieces)
    return text if text.isascii() else _well_formed(text)


# msgspec writes strings exactly as JSON.stringify does (checked against
# canonical_json over every code point in the tests) and, with sorted keys,
# orders ASCII keys as UTF-16 code units order them.
_sorted_encoder = msgspec.json.Encoder(order="sorted")


def _plain_blocks(blocks: Any) -> bool:
    """Blocks whose members are all ASCII-named strings: the shape every stored block has."""
    if type(blocks) is not list:
        return False
    for block in blocks:
        if type(block) is not dict:
            return False
        for key, value in block.items():
            if type(value) is not str or type(key) is not str or not key.isascii():
                return False
    return True


def body_digest(blocks: list[dict[str, Any]]) -> str:
    """sha256 hex of `canonical_json([blocks])` in UTF-8 (note the one-element array).

    Content blocks as the pipeline builds them take a fast path through
    msgspec, which writes the same bytes; anything else (numbers, non-ASCII
    keys, lone surrogates) goes through `canonical_json`.
    """
    return converted_body_digest(blocks) if _plain_blocks(blocks) else _digest(blocks)


def converted_body_digest(blocks: list[dict[str, str]]) -> str:
    """`body_digest` of blocks known to hold only ASCII-named strings (the pipeline's own)."""
    try:
        return hashlib.sha256(_sorted_encoder.encode([blocks])).hexdigest()
    except UnicodeEncodeError:  # a lone surrogate: canonical_json replaces it
        return _digest(blocks)


def _digest(blocks: Any) -> str:
    return hashlib.sha256(canonical_json([blocks]).encode("utf-8")).hexdigest()
