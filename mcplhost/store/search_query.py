"""What a search asks for, as the search index reads it: the strings every match contains, and the rows searched.

Pure functions and plain data, whatever the engine (docs/operations.md#searching); also how far an index has
got (`IndexProgress`). The index answers "which bodies contain all of these
strings"; it can serve a query only if every body the query matches contains some strings of
INDEX_RUN_MIN_CHARS or more that can be named before reading any body:

- a literal query requires itself;
- a regular expression requires the literal runs of its concatenation: characters that appear, in a row,
  in every match. Nothing inside an alternation, an optional or repeated part, a class, a lookaround or a
  group with flags of its own counts. The expression is read with the standard library's parser
  (`re._parser`), which reads the syntax the two modules share as `regex` does. Where they could read
  it differently, no run is taken and the search scans: a `{` read as a literal (`regex` may read a fuzzy-match
  constraint there), a parser warning (a nested set: `regex` reads a POSIX class), verbose mode, and
  whatever `regex` alone knows, which the standard parser refuses.

Case. A run is a string the body contains exactly (a case-sensitive query) or up to the case of each
character (`ignore_case`). Under `ignore_case` the `regex` module folds fully (FULLCASE): "ss" matches
"ß", "fi" matches "ﬁ", "t" with a combining mark matches "ẗ". So a case-insensitive run keeps only
characters whose every case-insensitive match is one character the index folds alike: ASCII, and
characters with no case at all (CJK, most symbols), but not the characters of a pair some character folds
to (FULLCASE_PAIRS), nor one beside a modifier letter or a combining mark. Other characters end a run.
Surrogates and control characters end a run in either case (the index cannot hold them as typed).
"""

from __future__ import annotations

import re
import unicodedata
import warnings

# The parser of the `re` module (private, so typeshed has no stubs for it).
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

import msgspec

#: The index holds trigrams: a run shorter than this narrows nothing.
INDEX_RUN_MIN_CHARS = 3
#: Pairs of ASCII letters that one other character folds to in full (ß → ss, ﬁ → fi, ﬅ → st, ...): under
#: ignore_case a body may hold that one character where the query has the pair.
FULLCASE_PAIRS = frozenset({"ss", "ff", "fi", "fl", "st"})
#: Categories of characters that stand next to a letter in a full case folding (ẚ → aʾ, ǰ → ǰ): a character
#: beside one of these may be half of a character the body holds folded.
_JOINING_CATEGORIES = frozenset({"Lm", "Mn", "Mc", "Me"})
_LITERAL_BRACE = ord("{")
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)


class Required(msgspec.Struct, frozen=True):
    """Strings every matching body contains (exactly, or up to each character's case with `ignore_case`), in
    this order and apart: each is a stretch of the match, the stretches taken left to right."""

    runs: tuple[str, ...]
    ignore_case: bool


class SearchFilter(msgspec.Struct, frozen=True):
    """The rows a search reads; each field becomes an SQL condition, so excluded rows are not read.

    `heard`: None reads every row, agents' own included (`mcplhost search`); a tuple reads only the items
    everyone may see (no agent's own rows) from what those `hears` entries hear, by the rule of
    mcplhost/agents/hearing.py `heard_by` (an empty tuple hears every connector): `history_search`.
    `channel`: only that channel id (`--channel`). `since_ms`: only items created at or after it (`--since`).
    """

    heard: tuple[str, ...] | None = None
    channel: str | None = None
    since_ms: int | None = None


class IndexProgress(msgspec.Struct, frozen=True):
    """How far the index has got: every item with an id at or below `indexed_to` is in it."""

    indexed_to: int
    newest: int  # the newest item's id (0: none)

    @property
    def behind(self) -> int:
        """Ids above the mark: at most this many items a search reads row by row."""
        return max(0, self.newest - self.indexed_to)


class _Unsure(Exception):
    """The expression may not mean to `regex` what the standard parser read: take no run."""


def required(query: str, *, as_regex: bool, ignore_case: bool) -> Required | None:
    """The runs of INDEX_RUN_MIN_CHARS or more every body the query matches contains; None if it has none."""
    if as_regex:
        parsed = _literal_runs(query, ignore_case)
        if parsed is None:
            return None
        runs, ignore_case = parsed
    else:
        runs = [query]
    usable = [piece for run in runs for piece in usable_pieces(run, ignore_case)]
    usable = [piece for piece in dict.fromkeys(usable) if len(piece) >= INDEX_RUN_MIN_CHARS]
    return Required(tuple(usable), ignore_case) if usable else None


def usable_pieces(run: str, ignore_case: bool) -> list[str]:
    """`run` cut where a character cannot be looked up in the index (the module docstring's rules)."""
    keep = [_typable(ch) and (not ignore_case or _caseless_or_ascii(ch)) for ch in run]
    if ignore_case:
        for i in range(len(run) - 1):
            if run[i : i + 2].isascii() and run[i : i + 2].lower() in FULLCASE_PAIRS:
                keep[i] = keep[i + 1] = False
        for i, ch in enumerate(run):
            if not ch.isascii() and unicodedata.category(ch) in _JOINING_CATEGORIES:
                if i > 0:
                    keep[i - 1] = False
                if i + 1 < len(run):
                    keep[i + 1] = False
    pieces: list[str] = []
    start = None
    for i, ok in enumerate([*keep, False]):
        if ok and start is None:
            start = i
        elif not ok and start is not None:
            pieces.append(run[start:i])
            start = None
    return pieces


def _typable(ch: str) -> bool:
    return ch >= " " and ch != "\x7f" and not "\ud800" <= ch <= "\udfff"


def _caseless_or_ascii(ch: str) -> bool:
    """ASCII, or a character with no case mapping at all that folds into nothing else."""
    if ch.isascii():
        return True
    return (ch.lower() == ch.upper() == ch.casefold() == ch
            and unicodedata.category(ch)[0] not in ("C", "M") and unicodedata.category(ch) not in _JOINING_CATEGORIES)


def _literal_runs(pattern: str, ignore_case: bool) -> tuple[list[str], bool] | None:
    """The literal runs of the expression's concatenation, and whether it ignores case; None when unsure."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning (a nested set, ...) means the two parsers may differ
            parsed = sre_parse.parse(pattern, re.IGNORECASE if ignore_case else 0)
    except (re.error, Warning, RecursionError, OverflowError, ValueError):
        return None
    flags = parsed.state.flags
    if flags & re.VERBOSE:
        return None
    runs: list[str] = []
    current: list[str] = []
    try:
        _walk(list(parsed), runs, current)
    except (_Unsure, RecursionError):
        return None
    _end(runs, current)
    return runs, bool(flags & re.IGNORECASE)


def _end(runs: list[str], current: list[str]) -> None:
    if current:
        runs.append("".join(current))
        current.clear()


def _walk(items: list[tuple[Any, Any]], runs: list[str], current: list[str]) -> None:
    """Collect the runs of one concatenation; a `{` read as a literal anywhere below raises _Unsure."""
    for op, av in items:
        if op is sre.LITERAL:
            if av == _LITERAL_BRACE:
                raise _Unsure
            current.append(chr(av))
        elif op is sre.SUBPATTERN and not av[1] and not av[2]:
            _walk(list(av[3]), runs, current)  # a plain group goes on with the concatenation
        elif op in _REPEATS:
            low, _, item = av
            _end(runs, current)
            if low >= 1:  # the item appears at least once: its own runs are required, apart
                _walk(list(item), runs, current)
                _end(runs, current)
            else:
                _refuse_braces(item)
        elif op is sre.ATOMIC_GROUP:
            _end(runs, current)
            _walk(list(av), runs, current)
            _end(runs, current)
        else:  # a class, an anchor, an alternation, a lookaround, a backreference, a group with flags
            _end(runs, current)
            _refuse_braces(av)


def _refuse_braces(node: Any) -> None:
    """Raise _Unsure if a literal `{` is anywhere in `node` (a part that requires nothing may still hold one)."""
    if isinstance(node, sre_parse.SubPattern):
        node = list(node)
    if isinstance(node, (list, tuple)):
        if len(node) == 2 and node[0] is sre.LITERAL and node[1] == _LITERAL_BRACE:
            raise _Unsure
        for child in node:
            _refuse_braces(child)
