"""The canonical manifest digest (SPEC §17.2, RFC-003 §3.1).

    revision = "sha256:" + base64url_nopad(SHA-256(UTF-8(JCS(normalize(strip(manifest))))))

1. strip: drop the root `revision` member, and nothing else.
2. normalize: at three set-valued positions, an array of strings is
   deduplicated and sorted by UTF-8 bytes; identifier positions are checked
   against [A-Za-z0-9._:*-]+. Everything else is kept verbatim: no boolean
   expansion, no flattening, and arrays keep their order.
3. JCS (RFC 8785): sorted members, no whitespace, ECMAScript string escaping
   and ECMAScript number formatting.

The function is total over JSON objects. It refuses (ManifestDigestError,
a ValueError) only for a non-object, a bad identifier, a non-finite number,
or input JSON cannot carry. The vector file
tests/protocol/data/manifest-digest-vectors.json is the acceptance test.

Where sources disagree on identifier positions, this follows the
reference generator: `tags.<t>.facet` is checked, `suggestedTreatment`
matchers are not.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Iterable
from typing import Any

from mcplhost.jsonobject import JsonObject
from mcplhost.protocol.vocabulary import NON_CAPABILITY_MEMBERS

# Error codes. The first two are the vector file's `errorCodes`; the others
# name refusals the vector file does not cover.
MANIFEST_NOT_OBJECT = "manifest_not_object"
IDENTIFIER_CHARSET = "identifier_charset"
NON_FINITE_NUMBER = "non_finite_number"
NOT_JSON = "not_json"  # a value JSON cannot carry: lone surrogate, non-string member name
TOO_DEEP = "too_deep"

# Real manifests nest about eight levels. The cap keeps hostile input from
# exhausting the interpreter's recursion limit mid-digest.
MAX_NESTING_DEPTH = 128

_IDENTIFIER = re.compile(r"[A-Za-z0-9._:*-]+")

# Positions are paths from the manifest root. `*` matches any member name and
# never an array element (`_ELEMENT`), so the non-conforming array form of
# `featureSets` is hashed verbatim, unnormalized and unchecked.
_ELEMENT = object()
_ANY = "*"

# Arrays of strings here are sets: deduplicated and sorted by UTF-8 bytes.
SET_VALUED_POSITIONS: tuple[tuple[str, ...], ...] = (
    ("featureSets", _ANY, "uses"),
    ("featureSets", _ANY, "tagOntology", "coreTags"),
    ("featureSets", _ANY, "tagOntology", "tags", _ANY, "implies"),
)
# Arrays whose elements are identifiers (checked only when all are strings).
IDENTIFIER_ARRAYS: tuple[tuple[str, ...], ...] = SET_VALUED_POSITIONS + (
    ("featureSets", _ANY, "tagOntology", "keyed", _ANY, "values"),
)
# Objects whose member names are identifiers.
IDENTIFIER_KEYED_OBJECTS: tuple[tuple[str, ...], ...] = (
    ("featureSets",),
    ("featureSets", _ANY, "tagOntology", "tags"),
    ("featureSets", _ANY, "tagOntology", "keyed"),
)
# String values that are identifiers (the vector file's extra position).
IDENTIFIER_VALUES: tuple[tuple[str, ...], ...] = (
    ("featureSets", _ANY, "tagOntology", "tags", _ANY, "facet"),
)


class ManifestDigestError(ValueError):
    """The digest was refused; `code` names why (the vector file's error codes)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def utf8_sort_key(value: str) -> bytes:
    """Sort key for set-valued arrays: UTF-8 byte order (same as code-point order)."""
    return value.encode("utf-8", "surrogatepass")


def normalize_string_set(values: Iterable[str]) -> list[str]:
    """Deduplicate and sort strings by UTF-8 bytes, as set-valued arrays are."""
    return sorted(set(values), key=utf8_sort_key)


def _at(path: tuple[Any, ...], positions: tuple[tuple[str, ...], ...]) -> bool:
    return any(
        len(path) == len(position)
        and all(
            got is not _ELEMENT and (want == _ANY or want == got)
            for want, got in zip(position, path)
        )
        for position in positions
    )


def _describe(path: tuple[Any, ...]) -> str:
    return ".".join("[]" if part is _ELEMENT else part for part in path).replace(".[]", "[]")


def _require_identifier(value: str, path: tuple[Any, ...]) -> None:
    if not _IDENTIFIER.fullmatch(value):
        raise ManifestDigestError(IDENTIFIER_CHARSET, f"{_describe(path)} = {value!r}")


def _name_is_identifier(path: tuple[Any, ...], name: str) -> bool:
    """Whether member `name` of the object at `path` is an identifier position.

    Capability member names are path segments at every depth, including in
    objects nested in arrays, so the whole capability subtree is checked.
    """
    if not path:
        return name not in NON_CAPABILITY_MEMBERS
    return path[0] not in NON_CAPABILITY_MEMBERS or _at(path, IDENTIFIER_KEYED_OBJECTS)


def _normalize_object(value: dict[Any, Any], path: tuple[Any, ...]) -> JsonObject:
    out = {}
    for name, member in value.items():
        if not isinstance(name, str):
            raise ManifestDigestError(NOT_JSON, f"member name {name!r} at {_describe(path)}")
        if _name_is_identifier(path, name):
            _require_identifier(name, path + (name,))
        out[name] = _normalize(member, path + (name,))
    return out


def _normalize(value: Any, path: tuple[Any, ...]) -> Any:
    if len(path) > MAX_NESTING_DEPTH:
        raise ManifestDigestError(TOO_DEEP, f"nesting deeper than {MAX_NESTING_DEPTH}")
    if isinstance(value, dict):
        return _normalize_object(value, path)
    if isinstance(value, list):
        items = [_normalize(item, path + (_ELEMENT,)) for item in value]
        if not all(isinstance(item, str) for item in items):
            # A non-string element makes the array non-conforming; it is
            # hashed verbatim, neither checked nor sorted (SPEC §17.2 totality).
            return items
        if _at(path, IDENTIFIER_ARRAYS):
            for item in items:
                _require_identifier(item, path + (_ELEMENT,))
        if _at(path, SET_VALUED_POSITIONS):
            return normalize_string_set(items)
        return items
    if isinstance(value, str) and _at(path, IDENTIFIER_VALUES):
        _require_identifier(value, path)
    return value


def strip_and_normalize(manifest: Any) -> JsonObject:
    """The manifest as it is hashed: root `revision` removed, sets normalized, identifiers checked."""
    if not isinstance(manifest, dict):
        raise ManifestDigestError(MANIFEST_NOT_OBJECT, type(manifest).__name__)
    stripped = {name: value for name, value in manifest.items() if name != "revision"}
    return _normalize_object(stripped, ())


# --- RFC 8785 (JCS) serialization -------------------------------------------

# ECMAScript JSON.stringify escapes only the quote, the backslash and C0
# controls. Those two and five of the controls have short forms; the other
# controls become \u00xx in lowercase. Everything else is literal.
_SHORT_ESCAPES = {
    "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\",
}
_ESCAPES = {chr(c): _SHORT_ESCAPES.get(chr(c), f"\\u{c:04x}") for c in range(0x20)}
_ESCAPES.update(_SHORT_ESCAPES)
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")

# Beyond 2**53 a JSON number is no longer an exact integer in a double, which
# is what every JavaScript producer works with.
_EXACT_INT_LIMIT = 2**53


def _jcs_string(value: str) -> str:
    if _LONE_SURROGATE.search(value):
        raise ManifestDigestError(NOT_JSON, f"lone surrogate in {value!r}")
    return '"' + _NEEDS_ESCAPE.sub(lambda m: _ESCAPES[m.group()], value) + '"'


def ecmascript_number(value: int | float) -> str:
    """ECMAScript Number::toString of `value` taken as an IEEE double (RFC 8785 §3.2.2.3)."""
    if isinstance(value, int) and abs(value) < _EXACT_INT_LIMIT:
        return str(value)
    try:
        number = float(value)
    except OverflowError:  # an int beyond the double range is Infinity in JavaScript
        raise ManifestDigestError(NON_FINITE_NUMBER, "integer out of double range") from None
    if not math.isfinite(number):
        raise ManifestDigestError(NON_FINITE_NUMBER, repr(number))
    if number == 0:
        return "0"  # -0 too
    sign = "-" if number < 0 else ""
    # repr() yields the shortest digits that round-trip, as ECMAScript requires.
    mantissa, _, exponent = repr(abs(number)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    # value = 0.<digits> × 10**point
    point = int(exponent or 0) + len(whole) - (len(whole + fraction) - len(digits))
    digits = digits.rstrip("0")
    count = len(digits)
    if count <= point <= 21:
        return sign + digits + "0" * (point - count)
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * -point + digits
    exponent_text = f"{point - 1:+d}"
    if count == 1:
        return sign + digits + "e" + exponent_text
    return sign + digits[0] + "." + digits[1:] + "e" + exponent_text


def _jcs(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return _jcs_string(value)
    if isinstance(value, (int, float)):
        return ecmascript_number(value)
    if isinstance(value, list):
        return "[" + ",".join(_jcs(item) for item in value) + "]"
    if isinstance(value, dict):
        # RFC 8785 §3.2.3: members sorted by the UTF-16 code units of their names.
        names = sorted(value, key=lambda name: name.encode("utf-16-be", "surrogatepass"))
        return "{" + ",".join(_jcs_string(n) + ":" + _jcs(value[n]) for n in names) + "}"
    raise ManifestDigestError(NOT_JSON, f"{type(value).__name__} is not a JSON value")


def manifest_canonical_json(manifest: Any) -> str:
    """The exact JCS text that is hashed (before UTF-8 encoding)."""
    return _jcs(strip_and_normalize(manifest))


def manifest_sha256(manifest: Any) -> bytes:
    """SHA-256 over the UTF-8 bytes of the canonical text."""
    return hashlib.sha256(manifest_canonical_json(manifest).encode("utf-8")).digest()


def manifest_digest(manifest: Any) -> str:
    """The manifest's revision: "sha256:" + 43 base64url characters, unpadded.

    Raises ManifestDigestError (a ValueError) with a `code` when refused.
    """
    encoded = base64.urlsafe_b64encode(manifest_sha256(manifest)).decode("ascii").rstrip("=")
    return "sha256:" + encoded
