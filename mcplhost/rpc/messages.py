"""JSON-RPC 2.0 messages, decoded in two steps.

Step one decodes any JSON object into `Envelope`, whose members are all
optional and whose `params`/`result` stay undecoded (`msgspec.Raw`). Step two,
`classify`, applies JSON-RPC 2.0's rules and returns exactly one of
`Request`, `Notification`, `Response`, `ErrorResponse` or `Invalid`. The
layer above decodes `params` with a typed decoder chosen by method.

Reading is tolerant (unknown members are ignored); writing only ever produces
compact, well-formed single-line JSON. Decoding never raises: a line nested
deeper than `MAX_NESTING_DEPTH`, one that is not UTF-8, or one the decoder
fails on in any way (RecursionError, MemoryError ...), is an `Invalid` that
owes -32700 to id null. So a `Raw` member of a message always decodes as
JSON; decoding it into a type can only raise `msgspec.ValidationError`.
"""

from __future__ import annotations

import re
from itertools import accumulate, chain
from operator import neg
from typing import Any, Literal, Union

import msgspec
from msgspec import UNSET, Raw, UnsetType

from .limits import MAX_NESTING_DEPTH

RequestId = Union[int, str]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


class ErrorObject(msgspec.Struct):
    code: int
    message: str
    data: Any = UNSET


class Envelope(msgspec.Struct):
    """Any JSON object; members checked by `classify`, not by the decoder."""

    jsonrpc: Any = UNSET
    id: Any = UNSET
    method: Any = UNSET
    params: Raw | UnsetType = UNSET
    result: Raw | UnsetType = UNSET
    error: Any = UNSET


class Request(msgspec.Struct, frozen=True):
    id: RequestId
    method: str
    params: Raw | UnsetType = UNSET


class Notification(msgspec.Struct, frozen=True):
    method: str
    params: Raw | UnsetType = UNSET


class Response(msgspec.Struct, frozen=True):
    id: RequestId
    result: Raw


class ErrorResponse(msgspec.Struct, frozen=True):
    id: RequestId | None
    error: ErrorObject


class Invalid(msgspec.Struct, frozen=True):
    """Not a usable message; when `owes_reply`, the answer is `code` to `reply_id`.

    `stat` names the session statistic the line counts under.
    """

    reason: str
    reply_id: RequestId | None = None
    owes_reply: bool = False
    code: int = INVALID_REQUEST
    stat: str = "junk"


Message = Union[Request, Notification, Response, ErrorResponse, Invalid]


def valid_id(value: Any) -> bool:
    """Ids are strings or integers; `bool` is refused so `true` never aliases `1`."""
    kind = type(value)  # exact types: a bool is an int subclass, and never an id
    return kind is str or kind is int


class _Call(msgspec.Struct, frozen=True, gc=False):
    """A well-formed request (with `id`) or notification, as most lines are; any other line fails to decode
    into it and is read as an `Envelope`, whose `classify` gives the same answer for these two."""

    jsonrpc: Literal["2.0"]
    method: str
    id: RequestId | UnsetType = UNSET  # exact types: a bool or a float is not an int here
    params: Raw | UnsetType = UNSET


_call_decoder = msgspec.json.Decoder(_Call)
_error_decoder = msgspec.json.Decoder(ErrorObject)
_envelope_decoder = msgspec.json.Decoder(Envelope)


def classify(env: Envelope) -> Message:
    """Apply JSON-RPC 2.0's rules to a decoded envelope."""
    method = env.method
    if method is not UNSET:  # read once each: this runs for every line
        request_id = env.id
        if request_id is UNSET:
            if type(method) is not str or env.jsonrpc != "2.0":
                return Invalid("malformed notification")
            return Notification(method, env.params)
        id_kind = type(request_id)  # exact types, as valid_id: a bool is never an id
        if id_kind is not int and id_kind is not str:
            # A null or otherwise unusable id: the answer goes to id null.
            return Invalid("request id must be a string or an integer", None, owes_reply=True)
        if env.jsonrpc != "2.0":
            return Invalid('"jsonrpc" must be "2.0"', request_id, owes_reply=True)
        if type(method) is not str:
            return Invalid('"method" must be a string', request_id, owes_reply=True)
        return Request(request_id, method, env.params)
    has_result = env.result is not UNSET
    has_error = env.error is not UNSET
    if has_result == has_error:
        return Invalid("a response needs exactly one of result and error")
    if has_error:
        try:
            error = msgspec.convert(env.error, ErrorObject)
        except msgspec.ValidationError:
            error = ErrorObject(INTERNAL_ERROR, "malformed error object", data=env.error)
        if env.id is None or valid_id(env.id):
            return ErrorResponse(env.id, error)
        return Invalid("response id must be a string or an integer")
    if not valid_id(env.id):
        return Invalid("response id must be a string or an integer")
    return Response(env.id, env.result)  # type: ignore[arg-type]


# A JSON string, escapes included; outside strings valid JSON has no quote, so
# the leftmost quote always opens one and this match ends where it ends.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_CLOSERS = re.compile(rb"\]+")


_NOT_OPENERS = bytes(b for b in range(256) if b not in b"[{")


def _openers(line: bytes) -> int:
    """How many `[` and `{` `line` holds (in strings too): an upper bound of its depth.

    One C pass that keeps only those bytes (two `count`s cost twice its time on a short line).
    """
    return len(line.translate(None, _NOT_OPENERS))


_NOT_QUOTES_BRACKETS_OR_BACKSLASHES = bytes(b for b in range(256) if b not in b'"[]{}\\')


def _brackets_outside_strings(line: bytes) -> bytes:
    """The brackets of `line` outside its JSON strings, in order, `{}` as `[]`: those `_STRING.sub(b"", line)`
    leaves, for any bytes.

    Where no backslash stands before a quote or a backslash, no quote is escaped, so
    a string is exactly what lies between two consecutive quotes, and only the
    quotes and brackets matter: the rest is dropped first, in one C pass. A last
    quote with no partner opens no string (the regex finds no match there), so
    what follows it stays. Then two adjacent quotes go (an empty string, or two
    strings meeting: no character changes side), which leaves none in the usual
    line, whose strings hold no bracket; what is left is split at its quotes.
    The regex costs a match object per string, and a batch line holds hundreds.
    """
    kept = line.translate(None, _NOT_QUOTES_BRACKETS_OR_BACKSLASHES)
    if b"\\" in kept:  # a backslash somewhere: the line itself says whether one escapes a quote
        if b'\\"' in line or b"\\\\" in line:
            return _STRING.sub(b"", line).translate(_AS_BRACKETS, _NOT_BRACKETS)
        kept = kept.replace(b"\\", b"")  # none escapes a quote
    tail = b""
    if kept.count(b'"') % 2:  # the last quote opens no string: what follows it is outside
        last = kept.rindex(b'"')
        kept, tail = kept[:last], kept[last + 1 :]
    kept = kept.replace(b'""', b"")
    if b'"' in kept:
        kept = b"".join(kept.split(b'"')[::2])
    kept += tail
    return kept.translate(_AS_BRACKETS)


def nesting_exceeds(line: bytes, limit: int = MAX_NESTING_DEPTH) -> bool:
    """Whether the arrays and objects of `line` (outside strings) nest deeper than `limit`.

    Exact for valid JSON; for anything else the answer does not matter (the
    decoder refuses it) and only has to come back fast. Linear, and all in C
    but for one pass over runs of brackets: a line with no more openers than
    `limit` costs one `translate`. Otherwise strings are cut out and the brackets
    kept; each `replace` of the innermost pairs lowers the depth by one, done
    while it shrinks the string by an eighth or more; the depth of what is
    left is the highest running sum of its runs of openers and closers.
    """
    if _openers(line) <= limit:
        return False
    brackets = _brackets_outside_strings(line)
    if b"[" * (limit + 1) in brackets:  # a chain, the usual attack
        return True
    peeled = 0
    while brackets and peeled <= limit:
        inner = brackets.replace(b"[]", b"")
        if len(inner) * 8 > len(brackets) * 7:
            break
        brackets, peeled = inner, peeled + 1
    if not brackets:
        return peeled > limit  # balanced, and emptied by exactly as many peels as it was deep
    if peeled > limit:
        return True
    opens = map(len, _CLOSERS.split(brackets))
    closes = chain(map(neg, map(len, _CLOSERS.findall(brackets))), (0,))
    return peeled + max(accumulate(chain.from_iterable(zip(opens, closes)))) > limit


_TOO_DEEP = f"parse error: arrays and objects nested deeper than {MAX_NESTING_DEPTH} levels"


def decode_line(line: bytes) -> Message:
    """Decode one line; never raises. Non-JSON gives `Invalid` with reason "parse error"."""
    try:
        # The gate of `nesting_exceeds`, inlined: this runs for every line.
        if len(line.translate(None, _NOT_OPENERS)) > MAX_NESTING_DEPTH and nesting_exceeds(line):
            return Invalid(_TOO_DEEP, None, owes_reply=True, code=PARSE_ERROR, stat="too_deep")
        try:
            call: _Call | None = _call_decoder.decode(line)  # the usual line, typed in one C call
        except msgspec.ValidationError:  # valid JSON, but not a well-formed request or notification
            call = None
            env = _envelope_decoder.decode(line)
        if not line.isascii():
            # The decoder skips `params` and `result` unread (Raw): bad UTF-8 in them would
            # only surface when a handler decodes them. JSON is UTF-8, so the line is refused.
            line.decode("utf-8")
    except msgspec.DecodeError as exc:
        # Valid JSON that is not an object (an array, a number) also lands here.
        return Invalid(f"parse error: {exc}")
    except UnicodeDecodeError as exc:
        return Invalid(f"parse error: not UTF-8 at byte {exc.start}", None, owes_reply=True, code=PARSE_ERROR,
                       stat="undecodable")
    except Exception as exc:  # RecursionError, MemoryError ...: the peer's bytes never raise past this line
        return Invalid(f"parse error: {type(exc).__name__}", None, owes_reply=True, code=PARSE_ERROR,
                       stat="undecodable")
    if call is not None:
        if call.id is UNSET:
            return Notification(call.method, call.params)
        return Request(call.id, call.method, call.params)
    try:
        return classify(env)
    except Exception as exc:
        return Invalid(f"invalid message: {type(exc).__name__}", stat="undecodable")


# --- writing -----------------------------------------------------------------


class _OutRequest(msgspec.Struct, kw_only=True):
    jsonrpc: str = "2.0"
    id: RequestId
    method: str
    params: Any = UNSET


class _OutNotification(msgspec.Struct, kw_only=True):
    jsonrpc: str = "2.0"
    method: str
    params: Any = UNSET


class _OutResult(msgspec.Struct):
    jsonrpc: str  # built positionally: this is every answer's line
    id: RequestId
    result: Any


class _OutError(msgspec.Struct, kw_only=True):
    jsonrpc: str = "2.0"
    id: RequestId | None
    error: ErrorObject


_encoder = msgspec.json.Encoder()


def encode_request(id: RequestId, method: str, params: Any = UNSET) -> bytes:
    return _encoder.encode(_OutRequest(id=id, method=method, params=params)) + b"\n"


def encode_notification(method: str, params: Any = UNSET) -> bytes:
    return _encoder.encode(_OutNotification(method=method, params=params)) + b"\n"


def encode_result(id: RequestId, result: Any) -> bytes:
    return _encoder.encode(_OutResult("2.0", id, result)) + b"\n"


def encode_error(id: RequestId | None, code: int, message: str, data: Any = UNSET) -> bytes:
    return _encoder.encode(_OutError(id=id, error=ErrorObject(code, message, data))) + b"\n"
