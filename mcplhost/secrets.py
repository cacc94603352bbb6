"""Secret values the host knows, and the two things done with them: find and redact (docs/agents.md#secrets).

    secrets = Secrets({"DISCORD_TOKEN": "…", "OPENAI_API_KEY": "…"})
    secrets.find(text)    # the variable whose value `text` holds, or None
    secrets.redact(text)  # every value replaced by `[redacted:NAME]`

Which values are secret is decided where the config and the environment are
read (mcplhost/config.py); this module only holds them. A value shorter than
MIN_SECRET_CHARS is never treated as a secret: redacting "1" or "true"
everywhere would wreck every text and protect nothing.

The values are matched as literal text by one compiled alternation, longest
first, so a value that contains another is redacted whole.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: Values shorter than this are not secrets (check-config warns about them).
MIN_SECRET_CHARS = 8


def redaction(name: str) -> str:
    """What a secret's value is replaced by: its variable's name, never the value."""
    return f"[redacted:{name}]"


class Secrets:
    """An immutable set of secret values by variable name; empty is valid and costs nothing."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        kept = {name: value for name, value in (values or {}).items() if len(value) >= MIN_SECRET_CHARS}
        # One value named by two variables keeps the first name (sorted, so the choice is stable).
        self._names: dict[str, str] = {}
        for name in sorted(kept):
            self._names.setdefault(kept[name], name)
        ordered = sorted(self._names, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    @property
    def names(self) -> frozenset[str]:
        """The variables whose values are held."""
        return frozenset(self._names.values())

    def find(self, text: str) -> str | None:
        """The name of the variable whose value occurs first in `text`, or None."""
        if self._pattern is None:
            return None
        found = self._pattern.search(text)
        return None if found is None else self._names[found.group()]

    def redact(self, text: str) -> str:
        """`text` with every secret value replaced by `[redacted:NAME]`."""
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: redaction(self._names[m.group()]), text)

    def redact_json(self, value: Any) -> Any:
        """A JSON-like value (dicts, lists, strings) with every string redacted; keys too. Other values unchanged."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {self.redact(k) if isinstance(k, str) else k: self.redact_json(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_json(v) for v in value]
        return value

    def find_json(self, value: Any) -> str | None:
        """The name of a secret held anywhere in a JSON-like value (strings and keys), or None."""
        if self._pattern is None:
            return None
        if isinstance(value, str):
            return self.find(value)
        if isinstance(value, dict):
            for k, v in value.items():
                name = (self.find(k) if isinstance(k, str) else None) or self.find_json(v)
                if name is not None:
                    return name
            return None
        if isinstance(value, list | tuple):
            for v in value:
                name = self.find_json(v)
                if name is not None:
                    return name
        return None


#: No secrets: the default wherever none were given.
NO_SECRETS = Secrets()
