"""The answers the host reads from connectors, as msgspec Structs, and `decode_answer` (docs/connectors.md §13).

A connector's answer is hostile until decoded: `decode_answer` gives the
Struct or raises `MalformedAnswer` (its `detail` bounded), never anything
else. Unknown members are ignored everywhere, since connectors add members.

Leniency is part of each Struct, so that typing changed no refusal:

- a list the host judges entry by entry is `list[Raw]`, each entry decoded
  on its own (`decode_each`, `decode_entries`), so one malformed tool or
  backscroll entry is skipped and counted, never the whole list;
- a member named in the Struct's `LENIENT` counts as absent (its default)
  when it has another shape: an odd description keeps its tool, an odd
  `featureSet` keeps its injections. Any other member of another shape, or
  a required one missing, makes the whole value malformed. Leniency is one
  level deep: a lenient member is decoded strictly or not at all.

What the host asks, and which type reads the answer:

| request | read as | read in |
|---|---|---|
| `initialize` | `params.InitializeResult` (typed there) | protocol/connection.py |
| `featureSets/update` | `params.Receipt` (typed there) | protocol/policy.py `judge_receipt` |
| `mcpl/manifest` | any JSON value, judged whole by the manifest tracker (kept as the document it is) | protocol/manifest.py |
| `tools/list` | `ToolsPage`, its entries `ListedTool` | protocol/jobs.py `list_tools` |
| `channels/open` | `OpenedChannel`, its `history` (or `messages`) entries `BackscrollEntry` | protocol/jobs.py, agents/tools/toolbox.py |
| `tools/call` | `ToolResult`, its `content` entries `ContentBlock` | agents/tools/toolbox.py |
| `context/beforeInference` | `HookAnswer`, its entries `Injection` (blocks: `ContentBlock`) | agents/turns/hooks.py |
| `channels/publish` | `PublishResult` | speech/outbox.py |

Everything else the host sends expects no answer (`inference/lifecycle`,
`channels/outgoing/chunk` and `/complete`, `notifications/cancelled`). The
host never asks `channels/list`: connectors ask it of the host
(protocol/handlers.py answers), so no channels/list answer is ever read.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from typing import Annotated, Any, ClassVar, NamedTuple, TypeVar

import msgspec
from msgspec import UNSET, Meta, Raw

from .params import WHOLE, describe

#: Characters of a MalformedAnswer's detail (msgspec's message can quote a connector's value); the rest is cut.
MALFORMED_DETAIL_MAX_CHARS = 200

#: A string with at least one character: an empty name or id names nothing.
NonEmpty = Annotated[str, Meta(min_length=1)]


class MalformedAnswer(Exception):
    """A connector's answer (or one entry of it) is not the shape the host reads; `detail` says how, bounded."""

    def __init__(self, method: str, detail: str) -> None:
        self.method = method
        self.detail = detail if len(detail) <= MALFORMED_DETAIL_MAX_CHARS else (
            detail[:MALFORMED_DETAIL_MAX_CHARS] + "…")
        super().__init__(f"malformed {method} answer: {self.detail}")


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every answer: unknown members ignored; `LENIENT` members of another shape count as absent."""

    LENIENT: ClassVar[frozenset[str]] = frozenset()


A = TypeVar("A", bound=Answer)


def decode_answer(raw: Raw | bytes, kind: type[A], method: str) -> A:
    """`raw` as a `kind`, or MalformedAnswer (one strict pass; a second, member by member, only if it has LENIENT)."""
    decoded = _read(raw, kind)
    if isinstance(decoded, str):
        raise MalformedAnswer(method, decoded)
    return decoded


def decode_each(entries: Iterable[Raw], kind: type[A]) -> Iterator[A | None]:
    """Each entry as a `kind`, in order, or None for one that does not decode (each judged on its own).

    No MalformedAnswer is built for an entry that does not decode: a page can hold millions of them.
    """
    for entry in entries:
        value = _read(entry, kind)
        yield None if isinstance(value, str) else value


def decode_entries(entries: Iterable[Raw], kind: type[A]) -> tuple[list[A], int]:
    """The entries that decode as `kind`, in order, and how many did not."""
    decoded: list[A] = []
    malformed = 0
    for value in decode_each(entries, kind):
        if value is None:
            malformed += 1
        else:
            decoded.append(value)
    return decoded, malformed


class _Member(NamedTuple):
    name: str
    wire: str
    decoder: msgspec.json.Decoder[Any]
    required: bool
    lenient: bool


class _Reader(NamedTuple):
    strict: msgspec.json.Decoder[Any]
    members: tuple[_Member, ...]
    lenient: frozenset[str]  # the wire names of the LENIENT members


_OBJECT = msgspec.json.Decoder(dict[str, Raw])
#: Where the member a field path starts with ends (`author.name`, `content[0]` → author, content).
_MEMBER_END = re.compile(r"[.\[]")


@functools.cache
def _reader(kind: type[Answer]) -> _Reader:
    """The decoders of `kind`, built once (`msgspec.structs.fields` resolves the type hints at every call)."""
    members = tuple(_Member(field.name, field.encode_name, msgspec.json.Decoder(field.type), field.required,
                            field.name in kind.LENIENT) for field in msgspec.structs.fields(kind))
    return _Reader(msgspec.json.Decoder(kind), members, frozenset(m.wire for m in members if m.lenient))


def _member_at_fault(exc: msgspec.ValidationError) -> str | None:
    """The member a validation error is about (`content[0]` → "content"); None when about the whole value.

    The path is read by protocol/params.py `describe`, the one reader of msgspec's messages.
    """
    field, _ = describe(exc)
    return None if field == WHOLE else _MEMBER_END.split(field, maxsplit=1)[0]


def _read(raw: Raw | bytes, kind: type[A]) -> A | str:
    """`raw` as a `kind`, or why not (msgspec's message); never raises."""
    reader = _reader(kind)
    try:
        decoded: A = reader.strict.decode(raw)  # the decoder _reader built for `kind`
        return decoded
    except msgspec.ValidationError as exc:
        # Leniency is about members: an error not inside one (not an object, a required member missing)
        # is refused without a second pass.
        if _member_at_fault(exc) not in reader.lenient:
            return str(exc)
    except msgspec.DecodeError as exc:  # not JSON at all: nothing to be lenient about
        return str(exc)
    except RecursionError:  # a session's Raw is never this deep (rpc/messages.py); other bytes may be
        return "nested too deep"
    return _read_leniently(raw, kind, reader)


def _read_leniently(raw: Raw | bytes, kind: type[A], reader: _Reader) -> A | str:
    """Each member on its own: a LENIENT one of another shape is left out (its default), any other is fatal."""
    try:
        members = _OBJECT.decode(raw)
    except msgspec.DecodeError as exc:  # not an object, or (after a type error) not JSON either
        return str(exc)
    values: dict[str, Any] = {}
    for member in reader.members:
        value = members.get(member.wire)
        if value is None:
            if member.required:
                return f"Object missing required field `{member.wire}`"
            continue
        try:
            values[member.name] = member.decoder.decode(value)
        except msgspec.ValidationError as exc:
            if not member.lenient:
                return _at_member(str(exc), member.wire)
    return kind(**values)


def _at_member(message: str, name: str) -> str:
    """msgspec's message about a member decoded alone, with the member's path put back (`$.name[0]`)."""
    problem, found, where = message.partition(" - at `$")
    return f"{problem} - at `$.{name}{where if found else '`'}"


# --- tools/list (MCP) ---------------------------------------------------------------------


class ListedTool(Answer, frozen=True):
    """One MCP tool as listed: well formed when its `name` is a non-empty string."""

    LENIENT = frozenset({"description", "inputSchema"})

    name: NonEmpty
    description: str = ""
    inputSchema: dict[str, Any] | None = None  # noqa: N815 (the wire's name); None: offered with an empty schema


class ToolsPage(Answer, frozen=True):
    """One `tools/list` page: `tools` of another shape lists none; a `nextCursor` that is no string ends the listing."""

    LENIENT = frozenset({"tools", "nextCursor"})

    tools: list[Raw] = []  # each a ListedTool, judged on its own
    nextCursor: str | None = None  # noqa: N815


# --- channels/open --------------------------------------------------------------------------


class OpenedChannel(Answer, frozen=True):
    """The `channels/open` result: a descriptor to register, and the channel's recent messages (backscroll).

    Backscroll is an extension (docs/mcpl-compat.md#backscroll-on-channelsopen):
    `history` as discord-mcpl answers it, `messages` read only when `history` is absent.
    """

    LENIENT = frozenset({"messages", "history", "historyTruncated"})

    channel: Any = None  # judged like a registration (protocol/channels.py `parse_descriptor`); None: none sent
    history: list[Raw] | None = None  # each a BackscrollEntry, judged on its own; None: not sent
    historyTruncated: bool = False  # noqa: N815 (the wire's name): the connector clamped the limit asked for
    messages: list[Raw] = []  # the older shape, each a BackscrollEntry

    def backscroll(self) -> list[Raw]:
        """The entries to read: `history` when the connector sent it, else `messages`."""
        return self.history if self.history is not None else self.messages


class BackscrollAuthor(Answer, frozen=True):
    name: NonEmpty | None = None


class BackscrollEntry(Answer, frozen=True):
    """A backscroll entry: shaped like a `channels/incoming` message, `content` may also be a string.

    Only `content` is required; every other member of another shape (an empty
    id included) counts as absent.
    """

    LENIENT = frozenset({"channelId", "messageId", "threadId", "replyTo", "author", "metadata", "tags",
                         "timestamp"})

    content: str | list[dict[str, Any]]
    channelId: NonEmpty | None = None  # noqa: N815 (the wire's names)
    messageId: NonEmpty | None = None  # noqa: N815
    threadId: NonEmpty | None = None  # noqa: N815
    replyTo: NonEmpty | None = None  # noqa: N815
    author: BackscrollAuthor | None = None
    metadata: dict[str, Any] | None = None
    tags: list[str] = []
    timestamp: str | None = None


# --- tools/call (MCP) and hook injections ---------------------------------------------------


class ContentBlock(Answer, frozen=True):
    """A content block of a tool result or an injection: its `type` decides which other members count."""

    LENIENT = frozenset({"text", "data", "mimeType"})

    type: str
    text: str | None = None
    data: str | None = None
    mimeType: str | None = None  # noqa: N815


class ToolResult(Answer, frozen=True):
    """An MCP `tools/call` result; `isError` is true or counts as false."""

    LENIENT = frozenset({"content", "isError"})

    content: list[Raw] = []  # each a ContentBlock, judged on its own
    isError: bool = False  # noqa: N815
    structuredContent: Any = UNSET  # noqa: N815 (UNSET: absent; shown only when there is no content)


# --- context/beforeInference --------------------------------------------------------------


class Injection(Answer, frozen=True):
    """One context injection; each member of another shape counts as absent, so the judge names the first missing.

    `content` is a string or content blocks (each a ContentBlock, judged by agents/turns/hooks.py).
    """

    LENIENT = frozenset({"position", "namespace", "content"})

    position: str | None = None
    namespace: NonEmpty | None = None
    content: str | list[Raw] | None = None


class HookAnswer(Answer, frozen=True):
    """A `context/beforeInference` answer: `contextInjections` must be a list (absent: none); `featureSet` is only logged."""

    LENIENT = frozenset({"featureSet"})

    contextInjections: list[Raw] = []  # noqa: N815 (each an Injection, judged on its own)
    featureSet: str | None = None  # noqa: N815


# --- channels/publish -------------------------------------------------------------------------


class PublishResult(Answer, frozen=True):
    """The Request form's answer, `{delivered, messageId}`: strict, an answer of another shape fails the row."""

    delivered: bool
    messageId: str | None = None  # noqa: N815 (the wire's name); None: delivered, nothing to match echoes with
