"""The nesting pre-scan: exact on valid JSON (strings and escapes included), never raising on anything."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from mcplhost.rpc.limits import MAX_NESTING_DEPTH
from mcplhost.rpc.messages import (
    _AS_BRACKETS,
    _NOT_BRACKETS,
    _STRING,
    PARSE_ERROR,
    Invalid,
    Notification,
    Request,
    _brackets_outside_strings,
    decode_line,
    nesting_exceeds,
)

from ..properties import examples

# Strings full of what a naive scan trips on: quotes, backslashes and brackets.
tricky_text = st.text(alphabet=st.sampled_from('[]{}"\\\\/ ab\u00e9\u2028\n'), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky_text, inner, max_size=4),
    max_leaves=40,
)


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


class TestNestingExceeds:
    @settings(max_examples=examples(200))  # with the combs and the explicit cases below, enough to catch a miscounted escape
    @given(json_values, st.integers(min_value=0, max_value=8), st.booleans())
    def test_exact_on_valid_json(self, value: Any, limit: int, ascii_only: bool) -> None:
        """For any JSON text, whatever its strings hold, the answer is depth > limit."""
        line = json.dumps(value, ensure_ascii=ascii_only).encode()
        assert nesting_exceeds(line, limit) == (depth(value) > limit)

    @settings(max_examples=examples(100))
    @given(st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=30),
           st.integers(min_value=0, max_value=8))
    def test_exact_on_combs_and_stairs(self, shape: list[int], limit: int) -> None:
        """Siblings of different depths side by side (what the peeling shortcut must not miscount)."""
        value: Any = [nested_list(n) for n in shape]
        assert nesting_exceeds(json.dumps(value).encode(), limit) == (depth(value) > limit)

    @given(st.binary(max_size=300), st.integers(min_value=0, max_value=8))
    def test_any_bytes_give_a_bool(self, line: bytes, limit: int) -> None:
        assert nesting_exceeds(line, limit) in (True, False)

    @settings(max_examples=examples(200))
    @given(st.lists(st.sampled_from([b'"', b"\\", b"[", b"]", b"{", b"}", b"a", b":", b","]), max_size=60).map(b"".join))
    def test_the_split_keeps_what_the_regex_keeps_on_any_bytes(self, line: bytes) -> None:
        """Without escapes, the quotes-and-brackets cut leaves the brackets the string regex leaves, valid JSON or
        not: a line judged too deep is answered -32700 and an invalid one is not, so the two must agree
        everywhere."""
        assert _brackets_outside_strings(line) == _STRING.sub(b"", line).translate(_AS_BRACKETS, _NOT_BRACKETS)

    def test_the_bound_itself_passes_and_one_more_is_refused(self) -> None:
        assert not nesting_exceeds(b"[" * MAX_NESTING_DEPTH + b"]" * MAX_NESTING_DEPTH)
        assert nesting_exceeds(b"[" * (MAX_NESTING_DEPTH + 1) + b"]" * (MAX_NESTING_DEPTH + 1))
        assert nesting_exceeds(b'{"a":' * (MAX_NESTING_DEPTH + 1) + b"1" + b"}" * (MAX_NESTING_DEPTH + 1))

    def test_lines_with_only_strings_or_scalars_never_exceed(self) -> None:
        """Found by hypothesis: a line whose brackets are all inside strings is depth 0, even for limit 0."""
        for line in (b'"["', b'"{[{"', b"1", b'{"a":"[[["}'):
            assert nesting_exceeds(line, 0) == (line.startswith(b"{"))

    def test_brackets_inside_strings_do_not_count(self) -> None:
        deep_text = json.dumps(["[" * 500 + '\\"[' * 100]).encode()
        assert not nesting_exceeds(deep_text)


def nested_list(levels: int) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value, 0]
    return value


class TestDecodeLineNeverRaises:
    def test_deep_params_are_a_parse_error_owed_to_id_null(self) -> None:
        for params in (b"[" * 2000 + b"]" * 2000, b'{"a":' * 2000 + b"1" + b"}" * 2000):
            for head in (b'{"jsonrpc":"2.0","method":"m","params":', b'{"jsonrpc":"2.0","id":7,"method":"m","params":'):
                message = decode_line(head + params + b"}")
                assert isinstance(message, Invalid)
                assert (message.owes_reply, message.reply_id, message.code, message.stat) == (
                    True, None, PARSE_ERROR, "too_deep")

    def test_deep_but_unterminated_is_refused_too(self) -> None:
        """msgspec would recurse into this before finding it malformed (RecursionError)."""
        message = decode_line(b'{"jsonrpc":"2.0","method":"m","params":' + b"[" * 5000)
        assert isinstance(message, Invalid) and message.code == PARSE_ERROR

    def test_a_nesting_within_the_bound_decodes(self) -> None:
        levels = MAX_NESTING_DEPTH - 1  # the envelope is one level
        line = b'{"jsonrpc":"2.0","id":1,"method":"m","params":' + b"[" * levels + b"]" * levels + b"}"
        message = decode_line(line)
        assert isinstance(message, Request) and msgspec.json.decode(bytes(message.params)) is not None

    @settings(max_examples=examples(200))
    @given(st.binary(max_size=400) | json_values.map(lambda v: json.dumps(v).encode()))
    def test_any_line_decodes_to_a_message(self, line: bytes) -> None:
        """Whatever the bytes, decode_line returns; it never raises."""
        decode_line(line)

    def test_invalid_utf8_and_lone_surrogates(self) -> None:
        for line in (b'{"jsonrpc":"2.0","method":"\xff\xfe"}', b'{"jsonrpc":"2.0","method":"\\ud800"}',
                     b'{"jsonrpc":"2.0","method":"m","params":"\\udfff"}'):
            assert isinstance(decode_line(line), (Invalid, Notification))

    def test_bad_utf8_inside_params_is_a_parse_error_not_a_later_handler_failure(self) -> None:
        """The decoder skips params unread, so without the check a handler's decode raised DecodeError."""
        for params in (b'{"s":"\xff"}', b'{"s":"\xed\xa0\x80"}', b'["\xc3"]'):
            message = decode_line(b'{"jsonrpc":"2.0","id":1,"method":"m","params":' + params + b"}")
            assert isinstance(message, Invalid) and (message.code, message.reply_id) == (PARSE_ERROR, None)

    @settings(max_examples=examples(100))
    @given(st.binary(max_size=60))
    def test_every_raw_member_of_a_decoded_message_decodes(self, junk: bytes) -> None:
        """Whatever a params holds, once the line decodes, decoding its Raw raises at most a ValidationError."""
        message = decode_line(b'{"jsonrpc":"2.0","id":1,"method":"m","params":["' + junk.replace(b'"', b"")
                              .replace(b"\\", b"") + b'"]}')
        if isinstance(message, Request):
            try:
                msgspec.json.decode(bytes(message.params))
            except msgspec.ValidationError:
                pass

    def test_good_utf8_passes(self) -> None:
        line = '{"jsonrpc":"2.0","id":1,"method":"m","params":["héllo 😀 日本"]}'.encode()
        assert isinstance(decode_line(line), Request)
