"""The stored rows of a context as backend messages (docs/agents.md#compilation), before the compiler bounds them.

Each row becomes one unit of messages that stay together: a heard item or
an own row is one message; a tool-call message takes the round's other
calls and then every call's result, so no cut can separate a call from its
result. Text is neutralised on the way (`shown_text`: lookalike tags
escaped, docs/agents.md#compilation), but a host-made envelope's. `render`
then decides which images keep their pixels.

Rows are immutable once stored, and a context changes by a few rows from
one turn to the next, so each row's unit (its draft, size, and the rendered
`Message` of a text-only draft) can be kept between compiles in a bounded
`RenderedRows` of the store's; a kept unit is never changed afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from types import NoneType
from typing import Any, Literal

from mcplhost.agents.model import Message, ToolCall
from mcplhost.agents.turns.agent_rows import row_kind, tool_call_of, tool_result_call_id, turn_of
from mcplhost.inbound.author import author_line, shown_with_author
from mcplhost.inbound.digest import canonical_json
from mcplhost.inbound.source import INCOMING_LANE
from mcplhost.peers.envelope import RELATIONSHIPS, neutralise, parse_envelope
from mcplhost.store.items import StoredItem
from mcplhost.store.rows import ChannelSource, ItemMeta, PeerMeta, ToolResultMeta

#: Images that keep their pixels, newest first; older ones become "[image]" (docs/agents.md#compilation).
IMAGES_WITH_PIXELS = 4
#: What one image counts for against `context_chars`: about the ~1,000 tokens a model bills for it.
IMAGE_CHARS = 4000

#: Row renderings a `RenderedRows` keeps: everyone's CONTEXT_ROWS (2,000) rows, which every agent with the same
#: context_chars shares, and as many more for the agents' own rows and a second context_chars.
RENDERED_ROWS = 4096
#: Message caps (context_chars // 4), each with its set of connectors without the `from:` line, a `RenderedRows`
#: keeps rows for; a further one drops the oldest.
RENDERED_CAPS = 4

#: How every host line the model reads begins (notices, cut and age lines, synthetic results).
HOST = "[host] "
EMPTY_RESULT_TEXT = HOST + "The tool returned nothing."
INTERRUPTED_TEXT = HOST + "interrupted: this tool call got no result (the host stopped before it finished)."


_row_id = attrgetter("id")

# A part is a text string or an image block; a message's text parts are joined by "\n" when rendered.
Part = str | dict[str, Any]


@dataclass(slots=True)
class Draft:
    """A message under construction; `render` turns it into a `Message`."""

    role: Literal["user", "assistant", "tool"]
    parts: list[Part]
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    # A text-only draft's rendered message and its JSON, each made once (a cached row's draft is reused).
    message: Message | None = field(default=None, compare=False, repr=False)
    encoded: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class Unit:
    """Messages that stay together: one row's message, or a tool-call message and its results."""

    drafts: list[Draft]
    rows: int
    item_ids: list[int]
    turn: int | None = None
    chars: int = 0  # what the unit counts against context_chars, set once it is complete
    open_calls: bool = False  # a tool-call group that may still take calls of the same round
    results: dict[str, StoredItem] | None = None


def _is_image(block: dict[str, Any]) -> bool:
    return block.get("type") == "image" and isinstance(block.get("data"), str)


def parts_of(blocks: list[dict[str, Any]]) -> list[Part]:
    """Stored blocks as parts: texts, images (MCP shape), and "[type]" for anything else."""
    try:
        texts = [block["text"] for block in blocks if block["type"] == "text"]
        if len(texts) == len(blocks) and all(type(text) is str for text in texts):
            return texts  # the common case: text blocks only
    except (KeyError, TypeError):
        pass
    parts: list[Part] = []
    for block in blocks:
        text = block.get("text")
        if type(text) is str and block.get("type") == "text":
            parts.append(text)
        elif _is_image(block):
            parts.append({"type": "image", "data": block["data"], "mimeType": block.get("mimeType", "image/png")})
        else:
            parts.append(f"[{block.get('type', 'block')}]")
    return parts


def draft_chars(draft: Draft) -> int:
    """What a message counts against context_chars: text (+ 1 for each joining "\n"), images, tool calls."""
    chars = 0
    for part in draft.parts:
        chars += len(part) + 1 if type(part) is str else IMAGE_CHARS
    for call in draft.tool_calls:
        chars += len(call.name) + len(canonical_json(call.arguments))
    return chars


def clip_text(parts: list[Part], max_chars: int, what: str) -> list[Part]:
    """`parts` whose text exceeds `max_chars` as one text of its head and tail with a [host] line; images kept after."""
    total = -1
    for part in parts:
        if type(part) is str:
            total += len(part) + 1  # with the "\n" joining it to the next
    if total <= max_chars:
        return parts
    texts = [p for p in parts if isinstance(p, str)]
    joined = "\n".join(texts)
    head = max_chars // 2
    tail = max_chars - head
    cut = len(joined) - head - tail
    line = f"\n{HOST}{cut} characters cut from the middle of this {what} ({len(joined)} in all).\n"
    return [joined[:head] + line + (joined[-tail:] if tail else ""), *[p for p in parts if isinstance(p, dict)]]


def neutralised(parts: list[Part]) -> list[Part]:
    """`parts` with every lookalike tag escaped (`neutralise`), each run of texts read as the "\n"-joined text
    the model sees, so a tag split across two parts is found too; `parts` itself when nothing changed."""
    out: list[Part] = []
    changed = False
    run: list[str] = []
    for part in [*parts, None]:
        if type(part) is str:
            run.append(part)
            continue
        if run:
            joined = "\n".join(run)
            shown = neutralise(joined)
            if shown is joined:
                out.extend(run)
            else:
                out.append(shown)
                changed = True
            run = []
        if part is not None:
            out.append(part)
    return out if changed else parts


def shown_text(parts: list[Part], max_chars: int, what: str) -> list[Part]:
    """Untrusted `parts` as a model is shown them: neutralised, then clipped (`clip_text`), and neutralised
    again when clipped, in case the cut put a tag's `<` right after the host line, away from its escape."""
    shown = neutralised(parts)
    clipped = clip_text(shown, max_chars, what)
    return clipped if clipped is shown else neutralised(clipped)


def _is_envelope(row: StoredItem, parts: list[Part]) -> bool:
    """Whether a peer row is a host-made envelope: its metadata says so and its text (`parts`) is exactly one
    envelope, whose only tags are the real ones (docs/peers.md#the-envelope-and-lookalikes)."""
    host = row.host
    if not isinstance(host, PeerMeta) or host.peer.relationship not in RELATIONSHIPS:
        return False
    texts = [part for part in parts if type(part) is str]
    return len(texts) == len(parts) and parse_envelope("\n".join(texts)) is not None


def build_units(name: str, rows: list[StoredItem], message_cap: int, result_cap: int,
                rendered: RenderedRows | None = None, no_author_line: frozenset[str] = frozenset()) -> list[Unit]:
    """The selected rows (oldest first) as units, each message clipped to `message_cap`, results to `result_cap`.

    `rendered`: the store's cache of row renderings; the units are the same with or without it.
    `no_author_line`: the connectors whose items get no `from:` line (`render_row`).
    """
    entries = rendered.lookup(rows, message_cap, no_author_line) if rendered is not None else [
        render_row(row, message_cap, no_author_line) for row in rows]
    if str not in set(map(type, entries)):
        return entries  # type: ignore[return-value]  # message rows only (the common case): one unit each
    results: dict[str, StoredItem] = {}
    for row in rows:
        call_id = tool_result_call_id(row) if row.agent == name else None
        if call_id is not None:
            results.setdefault(call_id, row)
    units: list[Unit] = []
    called: set[str] = set()
    for row, entry in zip(rows, entries, strict=True):
        if type(entry) is Unit:
            units.append(entry)
        elif entry == "tool-result":
            if units and units[-1].results is not None:
                units[-1].open_calls = False  # a later call belongs to the next round
            # placed with its call, or dropped as an orphan no backend would take
        elif entry == "tool-call":
            call = tool_call_of(row)  # not None: the entry says so
            if call is not None and call.id not in called:
                called.add(call.id)
                _add_call(units, row, call, results)
    for unit in units:
        if unit.results is not None:
            _close(unit, unit.results, result_cap)
            unit.chars = sum(draft_chars(d) for d in unit.drafts)
    return units


class RenderedRows:
    """Rows rendered, by message cap (with the connectors without a `from:` line) and row id, for one store's
    rows only; bounded, the first rendered out first.

    A stored row never changes and its id is never given to another row
    (nothing updates or deletes items), so within one store the id names
    the rendering; ids do repeat across stores, hence one per store (the
    host's `RowCache` holds it). Entries hold no row, so rows leave memory
    with the RowCache's window. Up to `size` rows for each of the newest
    RENDERED_CAPS message caps (agents with the same context_chars share); a reload that changes which
    connectors have `author_line = false` renders the rows again under the new set.
    """

    def __init__(self, size: int = RENDERED_ROWS) -> None:
        self.size = size
        self._by_cap: dict[tuple[int, frozenset[str]], dict[int, Rendered]] = {}

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_cap.values())

    def keys(self) -> list[tuple[int, frozenset[str]]]:
        """The (message cap, connectors without a `from:` line) the rows are rendered under now."""
        return list(self._by_cap)

    def lookup(self, rows: list[StoredItem], message_cap: int,
               no_author_line: frozenset[str] = frozenset()) -> list[Rendered]:
        """`render_row(row, message_cap, no_author_line)` for each row, each rendered once while it stays in
        the cache."""
        key = (message_cap, no_author_line)
        entries = self._by_cap.get(key)
        if entries is None:
            if len(self._by_cap) >= RENDERED_CAPS:
                del self._by_cap[next(iter(self._by_cap))]
            entries = self._by_cap[key] = {}
        found: list[Rendered | None] = list(map(entries.get, map(_row_id, rows)))  # the hits, at C speed
        if NoneType in set(map(type, found)):
            for index, entry in enumerate(found):
                if entry is None:
                    row = rows[index]
                    found[index] = entries[row.id] = render_row(row, message_cap, no_author_line)
            while len(entries) > self.size:
                del entries[next(iter(entries))]
        return found  # type: ignore[return-value]  # no None is left


# A row rendered: a message row's one-message unit (shared: never changed, see `_add_call`), or
# "tool-call", "tool-result", or "none" (a malformed or empty own row: nothing a backend could take).
Rendered = Unit | str


def item_author_line(meta: ItemMeta, participant: str | None) -> str | None:
    """The `from:` line of a heard item: only a channel message (lane `channels/incoming`) gets one, and only
    when it carried an author; a push, an unscoped item or console input never does."""
    if not isinstance(meta.source, ChannelSource) or meta.source.lane != INCOMING_LANE:
        return None
    return author_line(participant, meta.author_id)


def render_row(row: StoredItem, message_cap: int, no_author_line: frozenset[str] = frozenset()) -> Rendered:
    """One row as the compiler reads it, whatever the context around it.

    A heard item is shown with the host's `from:` line under its header, unless its connector is in
    `no_author_line`, and its body's leading `from:` escaped (docs/agents.md#who-said-what).
    """
    kind = row_kind(row) if row.agent is not None else "heard"
    if kind in ("tool-result", "tool-call"):
        return kind
    if kind == "other" and row.role not in ("user", "assistant"):
        return "none"
    if kind == "heard":
        meta = row.meta
        line = None if meta.server_id in no_author_line else item_author_line(meta, row.participant)
        parts = parts_of(shown_with_author(row.content, meta.source_header, line))
    else:
        parts = parts_of(row.content)
    if kind == "peer" and _is_envelope(row, parts):
        parts = clip_text(parts, message_cap, "message")  # host-made: its tags are the real ones
    else:
        parts = shown_text(parts, message_cap, "message")
    if kind == "notice":
        parts = host_prefixed(parts)
    draft = Draft("assistant" if kind in ("speech", "draft") or row.role == "assistant" else "user", parts)
    chars = draft_chars(draft)
    if chars <= len(parts):
        return "none"  # nothing to show (an empty own row); no backend takes an empty message
    if all(type(part) is str for part in parts):
        draft.message = text_message(draft)
    return Unit([draft], 1, [row.id], turn=turn_of(row) if row.agent else None, chars=chars)


def _add_call(units: list[Unit], row: StoredItem, call: ToolCall, results: dict[str, StoredItem]) -> None:
    """Join the call to the open group of its round, or to its turn's speech just before it, or start a group."""
    text = [p for p in parts_of(row.content) if isinstance(p, str) and p]
    last = units[-1] if units else None
    turn = turn_of(row)
    joinable = last is not None and (
        (last.results is not None and last.open_calls and last.turn == turn)
        or (last.results is None and len(last.drafts) == 1 and last.drafts[0].role == "assistant"
            and turn is not None and last.turn == turn))
    if last is None or not joinable:
        last = Unit([Draft("assistant", [])], 0, [], turn=turn, open_calls=True, results={})
        units.append(last)
    if last.results is None:  # the speech unit becomes a call group: a copy, the cached unit stays as it is
        speech = last.drafts[0]
        last = Unit([Draft(speech.role, list(speech.parts))], last.rows, list(last.item_ids), turn=last.turn,
                    chars=last.chars, open_calls=True, results={})
        units[-1] = last
    head = last.drafts[0]
    head.parts.extend(text)
    head.tool_calls.append(call)
    last.rows += 1
    last.item_ids.append(row.id)
    if call.id in results and last.results is not None:  # a call group's, made above when it was not yet one
        last.results[call.id] = results[call.id]


def _close(unit: Unit, results: dict[str, StoredItem], result_cap: int) -> None:
    """Put each call's result (`results`, the unit's own) or a synthetic "interrupted" right after the calls."""
    head = unit.drafts[0]
    head.parts = neutralised(head.parts)  # the calls' text joined the speech's: read as one, as the model will
    for call in head.tool_calls:
        result = results.get(call.id)
        if result is None:
            unit.drafts.append(Draft("tool", [INTERRUPTED_TEXT], tool_call_id=call.id))
            continue
        parts = shown_text(parts_of(result.content), result_cap, "tool result") or [EMPTY_RESULT_TEXT]
        if isinstance(result.host, ToolResultMeta) and result.host.is_error:
            parts = [f"{HOST}The tool reported an error.", *parts]
        unit.drafts.append(Draft("tool", parts, tool_call_id=call.id))
        unit.rows += 1
        unit.item_ids.append(result.id)


def host_prefixed(parts: list[Part]) -> list[Part]:
    for index, part in enumerate(parts):
        if isinstance(part, str):
            return [*parts[:index], HOST + part, *parts[index + 1:]]
    return [HOST.rstrip(), *parts]


def text_message(draft: Draft) -> Message:
    """A text-only draft as its message: the parts joined by "\n" in one text block."""
    content = [{"type": "text", "text": "\n".join(p for p in draft.parts if isinstance(p, str))}] if draft.parts else []
    return Message(role=draft.role, content=content, tool_calls=list(draft.tool_calls),
                   tool_call_id=draft.tool_call_id)


def render(drafts: list[Draft]) -> tuple[list[Message], int]:
    """Messages with the newest IMAGES_WITH_PIXELS images kept, and the index of the oldest message keeping one."""
    messages, oldest, _ = render_checked(drafts)
    return messages, oldest


def render_checked(drafts: list[Draft]) -> tuple[list[Message], int, list[Message]]:
    """`render`, and the messages a digest must still check for non-plain JSON (tool calls, images).

    A text-only message without tool calls has only ASCII keys and string
    values; a cached draft's message is rendered once and reused.
    """
    unchecked: list[Message] = []
    keep_pixels: set[tuple[int, int]] = set()
    for m in range(len(drafts) - 1, -1, -1):
        if len(keep_pixels) == IMAGES_WITH_PIXELS:
            break
        parts = drafts[m].parts
        if drafts[m].message is not None:
            continue  # a rendered draft is text only
        for p in range(len(parts) - 1, -1, -1):
            if isinstance(parts[p], dict) and len(keep_pixels) < IMAGES_WITH_PIXELS:
                keep_pixels.add((m, p))
    oldest = min((m for m, _ in keep_pixels), default=len(drafts))
    messages = []
    for m, draft in enumerate(drafts):
        if draft.message is None and all(type(part) is str for part in draft.parts):  # the common case
            draft.message = text_message(draft)
        if draft.message is not None:
            messages.append(draft.message)
            if draft.tool_calls:
                unchecked.append(draft.message)
            continue
        content = []
        run: list[str] = []
        for p, part in enumerate(draft.parts):
            if isinstance(part, str):
                run.append(part)
            elif (m, p) in keep_pixels:
                if run:
                    content.append({"type": "text", "text": "\n".join(run)})
                    run = []
                content.append(dict(part))
            else:
                run.append("[image]")
        if run:
            content.append({"type": "text", "text": "\n".join(run)})
        messages.append(Message(role=draft.role, content=content, tool_calls=list(draft.tool_calls),
                                tool_call_id=draft.tool_call_id))
        unchecked.append(messages[-1])
    return messages, oldest, unchecked
