"""Which names a message addresses: the one rule, for the console connector and the host's wake rules.

A body addresses NAME when it holds `@NAME` anywhere, or opens with `NAME:`
or `NAME,` (leading whitespace aside); NAME is matched without case and as
a whole word: `@ada` addresses ada, `@adam`, `@ada-bot` and `x@ada` do not,
`@Ada.` and `ADA, hi` do (docs/agents.md#addressing). Standard library only:
the bundled connectors import nothing else of mcplhost, and the host's wake
rules (mcplhost/agents/wakes/rules.py) import this module rather than restate it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["addressed_names"]

#: `@` not glued to a word before it (an e-mail address is no mention), then a name-shaped run of characters,
#: then no further word character or `-`, so the run is the whole word.
_AT_NAME = re.compile(r"(?<![\w@])@([A-Za-z0-9][A-Za-z0-9_-]*)(?![\w-])")
#: The body's start: optional whitespace, a name-shaped word, then `:` or `,` right after it.
_LEADING_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9_-]*)[:,]")


def addressed_names(text: str, names: Iterable[str]) -> list[str]:
    """Those of `names` (in their order) that `text` addresses; linear in `text`.

    A name is compared case-folded (two names differing only in case are both
    addressed); `names` are agent names: ASCII letters, digits, `_` and `-`
    (mcplhost/config/values.py NAME_PATTERN).
    """
    given = list(names)
    wanted = {name.casefold() for name in given}
    if not wanted or not text:
        return []
    found: set[str] = set()
    leading = _LEADING_NAME.match(text)
    if leading is not None and leading.group(1).casefold() in wanted:
        found.add(leading.group(1).casefold())
    if "@" in text:
        for match in _AT_NAME.finditer(text):
            key = match.group(1).casefold()
            if key in wanted:
                found.add(key)
                if len(found) == len(wanted):
                    break
    return [name for name in given if name.casefold() in found]
