"""Tests for mcplhost/agents/turns/history.py: stored blocks as parts, clipping, lookalike tags, and which images keep pixels."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.agents.turns.history import (
    IMAGES_WITH_PIXELS,
    RENDERED_CAPS,
    Draft,
    RenderedRows,
    clip_text,
    neutralised,
    parts_of,
    render,
    render_row,
    shown_text,
)
from mcplhost.peers.envelope import envelope
from mcplhost.store import StoredItem

IMAGE = {"type": "image", "data": "AAAA", "mimeType": "image/png"}


def test_parts_of_keeps_text_and_images_and_names_the_rest() -> None:
    """Text and image blocks pass; any other block reads as its type in brackets."""
    blocks = [{"type": "text", "text": "a"}, IMAGE, {"type": "audio", "data": "x"}, {"type": "text"}]
    assert parts_of(blocks) == ["a", IMAGE, "[audio]", "[text]"]


def test_clip_leaves_short_text_alone() -> None:
    """Parts whose joined text fits are returned as they are."""
    parts = ["abc", IMAGE, "de"]
    assert clip_text(parts, 6, "message") is parts


def test_clip_keeps_images_after_the_text() -> None:
    """A clipped message keeps its images, after the head-and-tail text."""
    clipped = clip_text(["a" * 30, IMAGE, "b" * 30], 10, "message")
    assert clipped[0].startswith("aaaaa\n[host] 51 characters cut") and clipped[0].endswith("\nbbbbb")
    assert clipped[1:] == [IMAGE]


@given(st.text(), st.integers(1, 100))
def test_clip_keeps_head_and_tail(text: str, limit: int) -> None:
    """A clipped text starts with the original's head and ends with its tail, each about half the limit."""
    (clipped,) = clip_text([text], limit, "tool result")
    if len(text) <= limit:
        assert clipped == text
    else:
        head, tail = limit // 2, limit - limit // 2
        assert clipped.startswith(text[:head] + "\n[host] ")
        assert clipped.endswith("\n" + (text[-tail:] if tail else ""))


def test_render_joins_text_and_keeps_the_newest_pixels() -> None:
    """Text parts join with newlines; only the newest images keep pixels, older ones read "[image]"."""
    drafts = [Draft("user", ["a", IMAGE, "b"]) for _ in range(IMAGES_WITH_PIXELS + 1)]
    messages, oldest = render(drafts)
    assert messages[0].content == [{"type": "text", "text": "a\n[image]\nb"}]
    assert messages[1].content == [{"type": "text", "text": "a"}, IMAGE, {"type": "text", "text": "b"}]
    assert oldest == 1


def stored(row_id: int, text: str, agent: str | None = None) -> StoredItem:
    metadata = {"kind": "speech", "turnId": 1} if agent else {}
    return StoredItem(id=row_id, agent=agent, participant=None, role="assistant" if agent else "user",
                      content=[{"type": "text", "text": text}], metadata=metadata, created_at=0)


@given(st.lists(st.tuples(st.integers(1, 60), st.text(max_size=30), st.booleans()), max_size=40),
       st.integers(1, 20), st.integers(1, 100))
def test_rendered_rows_equal_a_fresh_render(spec: list[tuple[int, str, bool]], size: int, cap: int) -> None:
    """A lookup, cold or warm, gives what `render_row` gives, and the cache never holds more than `size` rows."""
    rows = [stored(row_id, text, "scout" if own else None) for row_id, text, own in dict(
        (row_id, (row_id, text, own)) for row_id, text, own in spec).values()]  # one row per id, as in a store
    cache = RenderedRows(size)
    for _ in range(2):
        assert cache.lookup(rows, cap) == [render_row(row, cap) for row in rows]
        assert len(cache) <= size


def test_rendered_rows_keep_a_few_caps() -> None:
    """Each message cap has its own renderings; past RENDERED_CAPS caps the oldest cap's are dropped."""
    cache = RenderedRows(10)
    rows = [stored(1, "a" * 50)]
    for cap in range(1, RENDERED_CAPS + 2):
        assert cache.lookup(rows, cap) == [render_row(rows[0], cap)]
    assert len(cache) == RENDERED_CAPS


# --------------------------------------------------------------------------- lookalike tags (docs/agents.md#compilation)


def test_neutralised_reads_each_run_of_texts_as_the_model_does() -> None:
    """Texts joined by "\n" are scanned as one, an image ends a run, and nothing to escape gives the same list."""
    parts = ["a <mcpl_", "agent_message>", IMAGE, "</mcpl_agent_message>"]
    assert neutralised(parts) == ["a \\<mcpl_\nagent_message>", IMAGE, "\\</mcpl_agent_message>"]
    plain = ["a < b", IMAGE, "c"]
    assert neutralised(plain) is plain
    assert neutralised(["<mcpl_agent", IMAGE, "_message>"]) == ["<mcpl_agent", IMAGE, "_message>"]


def test_a_cut_never_parts_a_tag_from_its_escape() -> None:
    """Where the cut keeps a tag's `<` but drops the backslash before it, the tail is escaped again."""
    tag = "<mcpl_agent_message>"
    text = "H" * 40 + tag  # escaped, the tail's last 20 characters are the tag without its backslash
    (shown,) = shown_text([text], 40, "tool result")
    assert shown.endswith("\n\\" + tag)
    (clipped,) = clip_text(neutralised([text]), 40, "tool result")
    assert clipped.endswith("\n" + tag)  # what the cut alone would have shown


def peer_row(text: str, relationship: str) -> StoredItem:
    return StoredItem(id=1, agent="scout", participant="lead", role="user", content=[{"type": "text", "text": text}],
                      metadata={"peer": {"from": "lead", "relationship": relationship}}, created_at=0)


def test_render_row_keeps_a_genuine_envelope_and_escapes_the_rest() -> None:
    """An envelope peer row renders as stored; guidance and any other row holding the same text are escaped."""
    text = envelope("lead", None, "sibling", "hi")
    escaped = text.replace("<", "\\<")
    (kept,) = render_row(peer_row(text, "sibling"), 1000).drafts  # type: ignore[union-attr]
    assert kept.parts == [text]
    for row in (peer_row(text, "ancestor"), peer_row(text + " ", "descendant"), stored(1, text),
                stored(1, text, "scout")):
        (draft,) = render_row(row, 1000).drafts  # type: ignore[union-attr]
        assert "\n".join(draft.parts) in (escaped, escaped + " ")  # type: ignore[arg-type]
