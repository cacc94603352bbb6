"""Readers of what was said: they read bodies only, never the source header (PROVENANCE §6)."""

from __future__ import annotations

from typing import Any

import regex

from .inbound.notice import reader_body
from .store import Store

#: A user's regular expression gets this long per item before it is abandoned.
REGEX_TIMEOUT_S = 0.5
#: Characters of context on each side of a hit in a snippet.
SNIPPET_CONTEXT = 40


class SearchError(Exception):
    """The query cannot be used (e.g. an invalid regular expression)."""


def body_text(content: list[dict[str, Any]], metadata: dict[str, Any]) -> str:
    """The body's text blocks joined with nothing between, header dropped."""
    return "".join(b["text"] for b in reader_body(content, metadata) if b.get("type") == "text")


def _snippet(text: str, start: int, end: int) -> str:
    left = max(0, start - SNIPPET_CONTEXT)
    right = min(len(text), end + SNIPPET_CONTEXT)
    piece = text[left:right].replace("\n", " ")
    return ("…" if left else "") + piece + ("…" if right < len(text) else "")


async def search_items(store: Store, query: str, *, as_regex: bool = False, ignore_case: bool = False,
                       limit: int = 50) -> list[dict[str, Any]]:
    """Items whose body matches, newest first, each with a body snippet.

    `^` anchors at the body's start: the header is not part of what is searched.
    """
    flags = regex.IGNORECASE | regex.FULLCASE if ignore_case else 0
    try:
        pattern = regex.compile(query if as_regex else regex.escape(query), flags)
    except regex.error as exc:
        raise SearchError(f"invalid regular expression: {exc}") from None
    hits: list[dict[str, Any]] = []
    for item in reversed(await store.items.list()):
        text = body_text(item.content, item.metadata)
        try:
            match = pattern.search(text, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            continue
        if match is None:
            continue
        hits.append({
            "id": item.id, "serverId": item.metadata.get("serverId"), "channelId": item.metadata.get("channelId"),
            "participant": item.participant, "createdAt": item.created_at,
            "snippet": _snippet(text, match.start(), match.end()),
        })
        if len(hits) >= limit:
            break
    return hits
