"""Secret values the host knows, and the two things done with them: find and redact (docs/agents.md#secrets).

    secrets = Secrets({"DISCORD_TOKEN": "…", "OPENAI_API_KEY": "…"})
    secrets.find(text)    # the variable whose value `text` holds, or None
    secrets.redact(text)  # every value replaced by `[redacted:NAME]`
    guard = StreamGuard(secrets); guard.feed(piece) ... guard.finish()  # text streamed in pieces

Which values are secret is decided where the config and the environment are
read (mcplhost/config/environment.py); this module only holds them. A value shorter than
MIN_SECRET_CHARS is never treated as a secret: redacting "1" or "true"
everywhere would wreck every text and protect nothing.

The values are matched as literal text by one compiled alternation, longest
first, so a value that contains another is redacted whole; each value is also
matched as it is written inside a JSON string (its `"`, `\\` and control
characters escaped), since stored rows and JSON log lines hold it so.

The host builds one `Secrets` per run and shares it; `update` replaces its
values in place (a reload re-reads the env files), so every holder sees the
new set.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import msgspec

#: Values shorter than this are not secrets (check-config warns about them).
MIN_SECRET_CHARS = 8


def redaction(name: str) -> str:
    """What a secret's value is replaced by: its variable's name, never the value."""
    return f"[redacted:{name}]"


class _Compiled(NamedTuple):
    """What `Secrets` searches with, replaced whole on each update (a reader sees the old set or the new one)."""

    names: dict[str, str]  # each form a value is found in (plain, JSON-escaped) → its variable
    pattern: re.Pattern[str] | None  # every form, longest first; None: no secret
    raw: re.Pattern[bytes] | None  # the same over UTF-8 bytes
    longest: int  # the longest form's length in characters
    forms: tuple[str, ...]  # longest first
    encoded: tuple[bytes, ...]  # the forms as UTF-8


class Secrets:
    """The secret values by variable name, replaced whole by `update`; empty is valid and costs nothing."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._pairs: frozenset[tuple[str, str]] = frozenset()
        self._set(frozenset((values or {}).items()))

    def update(self, values: Mapping[str, str]) -> None:
        """Hold `values` too, in place: everyone holding this object sees the new set (a reload).

        Values held before are kept (a connector a reload left running still holds its old token). The
        compiled state is replaced in one assignment, so a reader sees the old set or the new one.
        """
        self._set(self._pairs | frozenset(values.items()))

    def _set(self, pairs: frozenset[tuple[str, str]]) -> None:
        self._pairs = pairs = frozenset((name, value) for name, value in pairs if len(value) >= MIN_SECRET_CHARS)
        # One value named by two variables keeps the first name (sorted, so the choice is stable).
        names: dict[str, str] = {}
        for name, value in sorted(pairs):
            names.setdefault(value, name)
            # As it appears inside a JSON string too (stored rows, logged JSON): `"`, `\`, controls escaped.
            names.setdefault(json.dumps(value)[1:-1], name)
            names.setdefault(json.dumps(value, ensure_ascii=False)[1:-1], name)  # as msgspec writes it
        ordered = sorted(names, key=len, reverse=True)
        self._state = _Compiled(
            names=names,
            pattern=re.compile("|".join(map(re.escape, ordered))) if ordered else None,
            raw=re.compile(b"|".join(re.escape(v.encode()) for v in ordered)) if ordered else None,
            longest=max((len(value) for value in names), default=0),
            forms=tuple(ordered),
            encoded=tuple(v.encode() for v in ordered))

    @property
    def version(self) -> object:
        """The set held now, as a token: a new one whenever `update` changes it.

        A search that found none of the secrets holds for this version only, so a
        later step may skip the same search while the version is the same (the
        store writer does, for rows ingest searched: store/db.py).
        """
        return self._state

    @property
    def longest(self) -> int:
        """The longest secret's length in characters (0: none): a stream holds back one less (streaming.py)."""
        return self._state.longest

    def __bool__(self) -> bool:
        return self._state.pattern is not None

    @property
    def names(self) -> frozenset[str]:
        """The variables whose values are held."""
        return frozenset(self._state.names.values())

    def find(self, text: str) -> str | None:
        """The name of the variable whose value occurs first in `text`, or None."""
        state = self._state
        # `in` first: C substring search per value is many times faster than the alternation on text holding none.
        if state.pattern is None or not any(form in text for form in state.forms):
            return None
        found = state.pattern.search(text)
        return None if found is None else state.names[found.group()]

    def redact(self, text: str) -> str:
        """`text` with every secret value replaced by `[redacted:NAME]`."""
        state = self._state
        if state.pattern is None or not any(form in text for form in state.forms):
            return text
        return state.pattern.sub(lambda m: redaction(state.names[m.group()]), text)

    def redact_bytes(self, data: bytes) -> bytes:
        """`data` (UTF-8 text, or not) with every secret value's UTF-8 bytes replaced by `[redacted:NAME]`."""
        state = self._state
        if state.raw is None or not any(form in data for form in state.encoded):
            return data
        return state.raw.sub(lambda m: redaction(state.names[m.group().decode()]).encode(), data)

    def redact_json(self, value: Any) -> Any:
        """A JSON-like value (dicts, lists, strings) with every string redacted; keys too. Other values unchanged."""
        if not self:
            return value
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {self.redact(k) if isinstance(k, str) else k: self.redact_json(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_json(v) for v in value]
        return value

    def find_json(self, value: Any) -> str | None:
        """The name of a secret held anywhere in a JSON-like value (strings and keys), or None.

        Searched in the value's JSON text, one C encode (each value is held in its JSON-escaped form too); a
        value JSON cannot encode is walked instead.
        """
        if not self:
            return None
        try:
            return self.find(msgspec.json.encode(value).decode())
        except (TypeError, ValueError, UnicodeDecodeError):
            return self._walk_find(value)

    def _walk_find(self, value: Any) -> str | None:
        if isinstance(value, str):
            return self.find(value)
        if isinstance(value, dict):
            for k, v in value.items():
                name = (self.find(k) if isinstance(k, str) else None) or self._walk_find(v)
                if name is not None:
                    return name
            return None
        if isinstance(value, list | tuple):
            for v in value:
                name = self._walk_find(v)
                if name is not None:
                    return name
        return None

    def find_in_values(self, values: Iterable[Any]) -> bool:
        """Whether a text or a blob among `values` (a statement's parameters) holds a secret: one search for them all."""
        if not self:
            return False
        texts: list[str] = []
        blobs: list[bytes] = []
        for value in values:
            if type(value) is str:  # exact: a type test per value, and every text stored is a str
                texts.append(value)
            elif isinstance(value, BLOB_TYPES):
                blobs.append(bytes(value))
        return self.find_in(texts, blobs)

    def find_in(self, texts: list[str], blobs: list[bytes]) -> bool:
        """Whether any of `texts` or `blobs` holds a secret: joined, so a row of many values is one search."""
        if not self:
            return False
        joined = "\x00".join(texts)  # no value holds NUL (an environment cannot), so none spans two
        if self.find(joined) is not None:
            return True
        raw = b"\x00".join(blobs)
        return any(form in raw for form in self._state.encoded)


#: The values searched and redacted as bytes; a tuple: isinstance on a union is several times slower per value.
BLOB_TYPES = (bytes, bytearray, memoryview)

#: No secrets: the default wherever none were given.
NO_SECRETS = Secrets()


class StreamGuard:
    """Text that arrives in pieces, released only where no secret can hold it (docs/agents.md#secrets).

    The last (longest secret − 1) characters are held back, since the next
    piece may complete a secret they begin; `finish` releases them once
    nothing can. Each piece is searched with only the held-back characters
    before it (a secret not wholly inside what was searched before ends in
    the new piece, so it starts at most longest − 1 before it): the work is
    linear in the text streamed. Once a secret is seen, `found` names its
    variable and nothing more is released.
    """

    def __init__(self, secrets: Secrets) -> None:
        self._secrets = secrets
        self._held = ""  # the last (longest − 1) characters: not released yet
        self.found: str | None = None

    def feed(self, piece: str) -> str:
        """Add `piece`; the text that may be released now ("" for none, and always once a secret was seen)."""
        if self.found is not None:
            return ""
        if not self._secrets:
            return piece
        window = self._held + piece
        self.found = self._secrets.find(window)
        if self.found is not None:
            self._held = ""
            return ""
        keep = min(len(window), self._secrets.longest - 1)
        self._held = window[len(window) - keep:]
        return window[:len(window) - keep]

    def finish(self) -> str:
        """The end of the text: what was held back ("" once a secret was seen)."""
        held, self._held = self._held, ""
        return "" if self.found is not None else held
