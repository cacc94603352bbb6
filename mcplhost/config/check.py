"""The raw walk: every type problem of a decoded TOML document at once, each at its path.

msgspec stops at a document's first error; an operator fixing a file wants
every problem in one run, as ``connectors[0].grant: what is wrong``. So this
walk descends the Structs, lists and tables itself and asks msgspec about
each value beneath them.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import msgspec

from .schema import DERIVED_FIELDS


def check(value: Any, expected: Any, path: str) -> list[str]:
    """Check `value` against a type, descending into Structs and lists to report all."""
    struct = _struct_type(expected)
    if struct is not None and isinstance(value, dict):
        return _check_struct(value, struct, path)
    inner = _list_item_type(expected)
    if inner is not None and _struct_type(inner) is not None and isinstance(value, list):
        found: list[str] = []
        for i, item in enumerate(value):
            found += check(item, inner, f"{path}[{i}]")
        return found
    if get_origin(expected) is dict and isinstance(value, dict):
        # msgspec says only `$[...]` for a bad table value; name its key as TOML would.
        _, value_type = get_args(expected)
        found = []
        for key, item in value.items():
            name = key if _BARE_KEY.match(key) else json.dumps(key)
            found += check(item, value_type, f"{path}.{name}")
        return found
    if inner is not None and _literal_choices(inner) and isinstance(value, list):
        return [problem for i, item in enumerate(value) for problem in check(item, inner, f"{path}[{i}]")]
    choices = _literal_choices(expected)
    if choices and isinstance(value, str) and value not in choices:
        return [f"{path}: {value!r} is not one of {', '.join(map(repr, choices))}{_did_you_mean(value, choices)}"]
    try:
        msgspec.convert(value, expected)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `$")
        return [f"{path}{where.rstrip('`') or ''}: {message}" if path or where else f"(top level): {message}"]
    return []


def _literal_choices(tp: Any) -> tuple[str, ...]:
    """The strings a `Literal[...]` (or an optional one) allows; () for any other type."""
    if get_origin(tp) in (Union, UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        tp = options[0] if len(options) == 1 else None
    if get_origin(tp) is Literal:
        return tuple(str(choice) for choice in get_args(tp))
    return ()


def _did_you_mean(typed: str, known: Iterable[str]) -> str:
    """` (did you mean 'X'?)` for the closest of `known` to a mistyped key or value, or "" when none is close."""
    close = difflib.get_close_matches(typed, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_struct(value: dict[str, Any], struct: type[msgspec.Struct], path: str) -> list[str]:
    found: list[str] = []
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    prefix = f"{path}." if path else ""
    for key in value:
        if key not in fields or key in DERIVED_FIELDS:
            found.append(f"{prefix}{key}: unknown key" + _did_you_mean(key, fields.keys() - DERIVED_FIELDS))
    for name, field in fields.items():
        if name in DERIVED_FIELDS:
            continue
        if name not in value:
            if field.required:
                found.append(f"{prefix}{name}: required")
            continue
        found += check(value[name], field.type, f"{prefix}{name}")
    return found


#: A TOML bare key; any other key is written quoted in a problem's path.
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _struct_type(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct `tp` is, or is optionally (`X | None`); None otherwise."""
    if get_origin(tp) in (Union, UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        tp = options[0] if len(options) == 1 else None
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    return None


def _list_item_type(tp: Any) -> Any:
    return get_args(tp)[0] if get_origin(tp) is list else None


def entries(raw: dict[str, Any], kind: str) -> list[tuple[int, dict[str, Any]]]:
    items = raw.get(kind)
    if not isinstance(items, list):
        return []
    return [(i, item) for i, item in enumerate(items) if isinstance(item, dict)]


def strings(value: Any) -> list[tuple[int, str]]:
    """The non-empty strings of a list, with their indexes (the type checks report the rest)."""
    return [(j, v) for j, v in enumerate(value if isinstance(value, list) else []) if isinstance(v, str) and v]


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
