"""The request digest: SHA-256 of a compiled request's canonical JSON, fast when the JSON is plain (docs/agents.md#compilation).

    digest = request_digest(request)                       # 64 lowercase hex
    digest = digest_of(request, unchecked, drafts)         # the compiler's: known-plain messages not checked again

The turns row keeps the first request's digest; the same rows and settings
give the same digest, whatever backend answers.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from mcplhost.agents.model import Message, ModelRequest
from mcplhost.agents.turns.history import Draft
from mcplhost.inbound.digest import canonical_json, ecmascript_number

_sorted_encoder = msgspec.json.Encoder(order="sorted")
_EMPTY_MESSAGES = b'"messages":[]'


def request_digest(request: ModelRequest) -> str:
    """SHA-256 (64 lowercase hex) of the request's canonical JSON (docs/agents.md#compilation).

    A request whose every number is an integer (or a temperature both write
    alike, such as 0.7) and every key ASCII, which is what compiled content
    blocks are, takes msgspec's sorted encoder: it writes the same bytes as
    `canonical_json` (the tests hold the two equal) in a tenth of the time.
    Anything else (a temperature of 1.0, a float or non-ASCII key in tool
    arguments or schemas) goes through `canonical_json`.
    """
    return digest_of(request, request.messages, None)


def digest_of(request: ModelRequest, unchecked: list[Message], drafts: list[Draft] | None) -> str:
    """`request_digest`, checking for plain JSON only the messages in `unchecked` (the rest are known plain).

    With the `drafts` the messages were rendered from, each text-only
    draft's message is encoded once and its bytes reused (`_encode`).
    """
    if _plain_number(request.temperature) and all(_plain(tool.input_schema) for tool in request.tools) and all(
            _plain_message(m) for m in unchecked):
        try:
            encoded = _sorted_encoder.encode(request) if drafts is None else _encode(request, drafts)
            return hashlib.sha256(encoded).hexdigest()
        except UnicodeEncodeError:  # a lone surrogate: canonical_json replaces it
            pass
    return hashlib.sha256(canonical_json(msgspec.to_builtins(request)).encode("utf-8")).hexdigest()


def _encode(request: ModelRequest, drafts: list[Draft]) -> bytes:
    """`_sorted_encoder.encode(request)`, the messages spliced in from their drafts' kept bytes.

    The sorted keys put "messages" second, after "max_tokens" (an
    integer), so the first `"messages":[]` of the request encoded without
    messages is where the list goes.
    """
    chunks = []
    for draft, message in zip(drafts, request.messages, strict=True):
        if draft.message is not message:
            chunks.append(_sorted_encoder.encode(message))
            continue
        if draft.encoded is None:
            draft.encoded = _sorted_encoder.encode(message)
        chunks.append(draft.encoded)
    empty = _sorted_encoder.encode(msgspec.structs.replace(request, messages=[]))
    at = empty.index(_EMPTY_MESSAGES) + len(_EMPTY_MESSAGES) - 1
    return b"".join((empty[:at], b",".join(chunks), empty[at:]))


def _plain_number(x: float | None) -> bool:
    return x is None or _sorted_encoder.encode(x).decode() == ecmascript_number(x)


def _plain(x: Any) -> bool:
    """JSON whose keys are ASCII and whose numbers are integers: written alike by msgspec and canonical_json."""
    if isinstance(x, dict):
        return all(type(k) is str and k.isascii() and _plain(v) for k, v in x.items())
    if isinstance(x, list):
        return all(_plain(v) for v in x)
    return x is None or isinstance(x, (str, int))  # bool is an int; float is neither


def _plain_message(message: Message) -> bool:
    for block in message.content:
        for key, value in block.items():
            if type(value) is not str or not key.isascii():
                return False
    return all(_plain(call.arguments) for call in message.tool_calls)
