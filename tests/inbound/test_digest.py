"""Tests for mcplhost/inbound/digest.py: canonical_json, ecmascript_number and body_digest."""

from __future__ import annotations

import hashlib
import json
import math
import random
import struct
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mcplhost.inbound import body_digest, canonical_json
from mcplhost.inbound.digest import converted_body_digest, ecmascript_number
from tests.inbound.strategies import any_text

finite_floats = st.floats(allow_nan=False, allow_infinity=False)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), finite_floats, any_text)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(any_text, children, max_size=4)),
    max_leaves=20,
)
# Keys whose code-point order is also their UTF-16 order (no astral characters).
bmp_text = st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=["Cs"]))
json_values_without_floats = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), any_text),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(bmp_text, children, max_size=4)),
    max_leaves=20,
)
content_blocks = st.lists(
    st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, any_text),
        st.builds(lambda d, m: {"type": "image", "data": d, "mimeType": m}, st.text(), st.text()),
    ),
    max_size=5,
)


def _float_from_bits(bits: int) -> float:
    return struct.unpack(">d", bits.to_bytes(8, "big"))[0]


def _same_value(parsed: Any, original: Any) -> bool:
    """`parsed` reads as `original`; an integral float may come back as an int of the same value."""
    if isinstance(original, float):
        return isinstance(parsed, (int, float)) and not isinstance(parsed, bool) and float(parsed) == original
    if isinstance(original, dict):
        return isinstance(parsed, dict) and parsed.keys() == original.keys() and all(
            _same_value(parsed[key], value) for key, value in original.items()
        )
    if isinstance(original, list):
        return isinstance(parsed, list) and len(parsed) == len(original) and all(
            _same_value(a, b) for a, b in zip(parsed, original)
        )
    return type(parsed) is type(original) and parsed == original


def _reordered(x: Any, rng: random.Random) -> Any:
    """`x` with every object's keys in a shuffled insertion order."""
    if isinstance(x, dict):
        items = list(x.items())
        rng.shuffle(items)
        return {key: _reordered(value, rng) for key, value in items}
    if isinstance(x, list):
        return [_reordered(item, rng) for item in x]
    return x


class TestEcmascriptNumber:
    @pytest.mark.parametrize(
        ("bits", "text"),
        [
            # RFC 8785 appendix B: IEEE 754 bit patterns and ECMAScript's output.
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7FEFFFFFFFFFFFFF, "1.7976931348623157e+308"),
            (0xFFEFFFFFFFFFFFFF, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xC340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44B52D02C7E14AF5, "9.999999999999997e+22"),
            (0x44B52D02C7E14AF6, "1e+23"),
            (0x44B52D02C7E14AF7, "1.0000000000000001e+23"),
            (0x444B1AE4D6E2EF4E, "999999999999999700000"),
            (0x444B1AE4D6E2EF4F, "999999999999999900000"),
            (0x444B1AE4D6E2EF50, "1e+21"),
            (0x3EB0C6F7A0B5ED8C, "9.999999999999997e-7"),
            (0x3EB0C6F7A0B5ED8D, "0.000001"),
            (0x41B3DE4355555553, "333333333.3333332"),
            (0x41B3DE4355555554, "333333333.33333325"),
            (0x41B3DE4355555555, "333333333.3333333"),
            (0x41B3DE4355555556, "333333333.3333334"),
            (0x41B3DE4355555557, "333333333.33333343"),
            (0xBECBF647612F3696, "-0.0000033333333333333333"),
            (0x43143FF3C1CB0959, "1424953923781206.2"),
        ],
    )
    def test_rfc8785_vectors(self, bits: int, text: str) -> None:
        """Numbers are written exactly as ECMAScript (and RFC 8785's table) writes them."""
        assert ecmascript_number(_float_from_bits(bits)) == text

    @pytest.mark.parametrize(
        ("value", "text"),
        [(1.0, "1"), (-2.0, "-2"), (0.1, "0.1"), (1.5e-7, "1.5e-7"), (1e-7, "1e-7"), (123e-20, "1.23e-18"),
         (1e21, "1e+21"), (1e20, "100000000000000000000"), (float(2**60), "1152921504606847000"),
         (0.1 + 0.2, "0.30000000000000004"), (-0.0, "0"), (1.5e300, "1.5e+300")],
    )
    def test_layout(self, value: float, text: str) -> None:
        """Integral floats lose `.0`, and the exponent form starts where ECMAScript starts it."""
        assert ecmascript_number(value) == text

    @pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
    def test_non_finite_is_null(self, value: float) -> None:
        """NaN and infinities are written as `null`, as JSON.stringify writes them."""
        assert ecmascript_number(value) == "null"

    @given(st.floats(allow_nan=False, allow_infinity=False))
    def test_reads_back_as_the_same_float(self, value: float) -> None:
        """The written number parses back to the same float."""
        assert float(ecmascript_number(value)) == value

    @given(st.floats(allow_nan=False, allow_infinity=False).filter(lambda v: v != 0))
    @example(1e-6)
    @example(9.999999999999999e20)
    def test_exponent_form_only_outside_ecmascript_range(self, value: float) -> None:
        """Plain decimals are used for 1e-6 <= |x| < 1e21 and exponent form elsewhere, never a trailing `.0`."""
        text = ecmascript_number(value)
        assert ("e" in text) == (not 1e-6 <= abs(value) < 1e21)
        assert not text.endswith(".0")


class TestCanonicalJson:
    def test_example(self) -> None:
        """Keys are sorted, there is no whitespace, and non-ASCII text stays literal."""
        value = {"type": "text", "text": "h\u00e9 \U0001f431\n", "a": [1, 2.5, True, None, {"z": 1, "b": 2}]}
        expected = '{"a":[1,2.5,true,null,{"b":2,"z":1}],"text":"h\u00e9 \U0001f431\\n","type":"text"}'
        assert canonical_json(value) == expected

    def test_keys_sort_by_utf16_code_units(self) -> None:
        """An astral key (a surrogate pair in UTF-16) sorts before U+FFFF, as ECMAScript sorts."""
        assert canonical_json({"\uffff": 1, "\U00010000": 2, "a": 3}) == '{"a":3,"\U00010000":2,"\uffff":1}'

    def test_strings_as_json_stringify_writes_them(self) -> None:
        """Controls are escaped, U+007F and U+2028 stay literal, quotes and backslashes are escaped."""
        assert canonical_json("\x00\x1f\b\t\"\\\x7f\u2028") == '"\\u0000\\u001f\\b\\t\\"\\\\\x7f\u2028"'

    def test_lone_surrogates_become_replacement_characters(self) -> None:
        """A lone surrogate, in a value or a key, is written as U+FFFD."""
        assert canonical_json({"k\udc00": "a\ud800b"}) == '{"k\ufffd":"a\ufffdb"}'

    def test_bool_is_not_an_integer(self) -> None:
        """True and False are written as booleans, not as 1 and 0."""
        assert canonical_json([True, False, 1, 0]) == "[true,false,1,0]"

    def test_big_integers_stay_exact(self) -> None:
        """Python integers are written with all their digits."""
        assert canonical_json(2**64) == "18446744073709551616"

    def test_tuples_are_arrays(self) -> None:
        """A tuple is written as an array."""
        assert canonical_json((1, "a")) == '[1,"a"]'

    @pytest.mark.parametrize("value", [{1: "x"}, {"a": {1, 2}}, b"bytes", object()])
    def test_non_json_values_are_refused(self, value: Any) -> None:
        """Values JSON cannot hold raise TypeError."""
        with pytest.raises(TypeError):
            canonical_json(value)

    @given(json_values_without_floats)
    def test_agrees_with_sorted_json_dumps(self, value: Any) -> None:
        """Without floats or astral keys, the output is json.dumps with sorted keys and no whitespace."""
        expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert canonical_json(value) == expected

    @given(json_values)
    @example(6.080766483516447e16)
    def test_parses_back(self, value: Any) -> None:
        """The output is JSON that parses back to an equal value (integral floats may read back as ints)."""
        assert _same_value(json.loads(canonical_json(value)), value)

    @given(json_values, st.randoms(use_true_random=False))
    def test_ignores_key_order(self, value: Any, rng: random.Random) -> None:
        """The order keys were inserted in does not change the output."""
        assert canonical_json(_reordered(value, rng)) == canonical_json(value)


class TestBodyDigest:
    def test_one_element_array_framing(self) -> None:
        """The digest is sha256 of the blocks wrapped in a one-element array."""
        blocks = [{"type": "text", "text": "hello"}]
        framed = '[[{"text":"hello","type":"text"}]]'
        assert body_digest(blocks) == hashlib.sha256(framed.encode()).hexdigest()

    def test_is_64_lowercase_hex(self) -> None:
        """A digest is 64 lowercase hex characters."""
        digest = body_digest([])
        assert len(digest) == 64 and set(digest) <= set("0123456789abcdef")

    def test_text_changes_the_digest(self) -> None:
        """A changed body gives a different digest."""
        assert body_digest([{"type": "text", "text": "a"}]) != body_digest([{"type": "text", "text": "b"}])

    def test_lone_surrogate_hashes_as_replacement(self) -> None:
        """A lone surrogate hashes like U+FFFD, so a digest can always be taken."""
        assert body_digest([{"type": "text", "text": "\ud800"}]) == body_digest([{"type": "text", "text": "\ufffd"}])

    @given(content_blocks, st.randoms(use_true_random=False))
    @example([{"type": "text", "text": "x"}], random.Random(0))
    def test_ignores_key_order(self, blocks: list[dict[str, Any]], rng: random.Random) -> None:
        """Blocks with the same members in another order have the same digest."""
        assert body_digest(_reordered(blocks, rng)) == body_digest(blocks)

    @given(st.lists(st.dictionaries(st.sampled_from(["type", "text", "data", "mimeType", "uri"]), any_text),
                    max_size=5))
    @example([{"text": "\ud800", "type": "text"}])
    @example([{"text": "\U0001f600 \ue000", "type": "text"}])
    def test_fast_path_writes_what_canonical_json_writes(self, blocks: list[dict[str, Any]]) -> None:
        """Plain string blocks digest through msgspec exactly as through canonical_json."""
        expected = hashlib.sha256(canonical_json([blocks]).encode("utf-8")).hexdigest()
        assert body_digest(blocks) == expected
        assert converted_body_digest(blocks) == expected

    def test_msgspec_escapes_every_code_point_as_json_stringify_does(self) -> None:
        """The fast path's string writer agrees with canonical_json on every non-surrogate code point."""
        codes = [*range(0xD800), *range(0xE000, 0x110000)]
        for start in range(0, len(codes), 4096):  # escaping is per character, so runs compare like singles
            text = "".join(map(chr, codes[start : start + 4096]))
            assert converted_body_digest([{"text": text}]) == hashlib.sha256(
                canonical_json([[{"text": text}]]).encode("utf-8")).hexdigest(), hex(codes[start])
