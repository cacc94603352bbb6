"""A traceback for a log line, bounded: an exception's message can hold what a connector or a model sent.

Used where an exception boundary logs an unexpected error once (a
connector's crashed life, an agent's failed turn): the traceback is the
operator's best clue, and its size must not depend on hostile input.
"""

from __future__ import annotations

import traceback

#: Characters of one logged traceback; past it the middle is cut, keeping where it began and where it was raised.
TRACEBACK_MAX_CHARS = 20_000


def bounded_traceback(exc: BaseException) -> str:
    """The exception's formatted traceback (chained causes and groups included), at most about TRACEBACK_MAX_CHARS."""
    return cut_middle("".join(traceback.format_exception(exc)))


def cut_middle(text: str) -> str:
    """`text`, or past TRACEBACK_MAX_CHARS its beginning and its end (where it was raised) with the middle cut."""
    if len(text) <= TRACEBACK_MAX_CHARS:
        return text
    half = TRACEBACK_MAX_CHARS // 2
    return f"{text[:half]}\n… {len(text) - 2 * half} characters cut …\n{text[-half:]}"
