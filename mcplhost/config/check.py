"""The raw walk: every type problem of a decoded TOML document at once, and a typed config for the rules.

Why a walk of our own: msgspec stops at a document's first error, and an
operator fixing a file wants every problem in one run, each at its path
(``connectors[0].grant: what is wrong``). So this walk descends the Structs,
lists and tables of `Config` itself and asks msgspec about each value beneath
them. It is the only code of mcplhost/config/ that reads the raw document.

Beside the problems it hands the rules (mcplhost/config/rules.py,
mcplhost/config/machine.py) a `Config` to read even when the document has
problems, so they run in the same pass: every value of the right type (one
outside its limits included: the walk reported it), and where a value has the
wrong type or a required key is missing, a placeholder, the empty value of its
type (``""``, ``[]``, a table of defaults; an optional string or list is
written but empty, so a rule asking whether it is written answers as the
document does). `Checked.usable` says where a placeholder stands, for the
few checks that must then be skipped rather than read it.
"""

from __future__ import annotations

import difflib
import functools
import json
import operator
import re
from collections.abc import Callable, Iterable
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

from .schema import DERIVED_FIELDS, Config


class Checked(msgspec.Struct, frozen=True, kw_only=True):
    """What `check` found: the type problems, and the config the rules read."""

    problems: list[str]
    config: Config
    #: The paths (`connectors[0].cwd`) where a placeholder stands for the document's value.
    refused: frozenset[str]
    #: The paths of the tables' keys the document writes (`store.url`), as a rule between two keys asks.
    present: frozenset[str] = frozenset()

    def written(self, path: str) -> bool:
        """Whether the document writes the key at `path` (a default is not written, whatever its value)."""
        return path in self.present

    def usable(self, path: str) -> bool:
        """Whether `path` holds the document's value: neither it nor the table or list it lies in was refused."""
        return not any(path == p or path.startswith((p + ".", p + "[")) for p in self.refused)

    def usable_in(self, table: str) -> Callable[[str], bool]:
        """`usable` for the fields of the table at `table` (``usable_in("connectors[0]")("cwd")``)."""
        return lambda field: self.usable(f"{table}.{field}")


def check(raw: Any) -> Checked:
    """Every type problem of `raw` (a decoded TOML document) as ``path: what is wrong``, and the config it reads as."""
    walk = _Walk()
    config: Config = walk.value(raw, Config, "")
    return Checked(problems=walk.problems, config=config, refused=frozenset(walk.refused),
                   present=frozenset(walk.present))


class _Walk:
    """One walk's findings: the problems in document order, and the paths a placeholder fills."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.refused: set[str] = set()
        self.present: set[str] = set()

    def value(self, value: Any, expected: Any, path: str) -> Any:
        """Check `value` against a type, descending into Structs, lists and tables to report all."""
        struct = _struct_type(expected)
        if struct is not None and isinstance(value, dict):
            return self.struct(value, struct, path)
        inner = _list_item_type(expected)
        if inner is not None and isinstance(value, list) and (_struct_type(inner) or _literal_choices(inner)):
            return [self.value(item, inner, f"{path}[{i}]") for i, item in enumerate(value)]
        if get_origin(expected) is dict and isinstance(value, dict):
            # msgspec says only `$[...]` for a bad table value; name its key as TOML would.
            _, value_type = get_args(expected)
            return {key: self.value(item, value_type, f"{path}.{_key(key)}") for key, item in value.items()}
        choices = _literal_choices(expected)
        if choices and isinstance(value, str) and value not in choices:
            self.problems.append(f"{path}: {value!r} is not one of {', '.join(map(repr, choices))}"
                                 f"{_did_you_mean(value, choices)}")
            return self.placeholder(expected, path)
        try:
            return msgspec.convert(value, expected)
        except msgspec.ValidationError as exc:
            message, _, where = str(exc).partition(" - at `$")
            self.problems.append(f"{path}{where.rstrip('`')}: {message}" if path or where
                                 else f"(top level): {message}")
        return self.salvage(value, expected, path)

    def struct(self, value: dict[str, Any], struct: type[msgspec.Struct], path: str) -> msgspec.Struct:
        """A table: its unknown keys first, then each field in the Struct's order (built unvalidated)."""
        fields = {f.encode_name: f for f in msgspec.structs.fields(struct) if f.encode_name not in DERIVED_FIELDS}
        prefix = f"{path}." if path else ""
        for key in value:
            if key not in fields:
                self.problems.append(f"{prefix}{key}: unknown key" + _did_you_mean(key, fields))
        found: dict[str, Any] = {}
        for name, field in fields.items():
            if name in value:
                self.present.add(f"{prefix}{name}")
                found[field.name] = self.value(value[name], field.type, f"{prefix}{name}")
            elif field.required:
                self.problems.append(f"{prefix}{name}: required")
                found[field.name] = self.placeholder(field.type, f"{prefix}{name}")
        return struct(**found)

    def salvage(self, value: Any, expected: Any, path: str) -> Any:
        """What the rules read where msgspec refused `value`: each item of a list, the value itself when only a
        limit is broken (`Meta`), else a placeholder."""
        inner = _list_item_type(_optional_of(_unconstrained(expected)))
        if inner is not None and isinstance(value, list):
            return [self.salvage(item, inner, f"{path}[{i}]") for i, item in enumerate(value)]
        try:
            return msgspec.convert(value, _unconstrained(expected))
        except msgspec.ValidationError:
            return self.placeholder(expected, path)

    def placeholder(self, expected: Any, path: str) -> Any:
        """The empty value of `expected`, standing at `path` for the document's."""
        self.refused.add(path)
        return _empty(expected)


def _empty(tp: Any) -> Any:
    """The empty value of a type: "", [], {}, 0, False, the first of a Literal's choices, a Struct of defaults.

    An optional string or list is "" or [] rather than None: written, but unusable.
    """
    tp = _unconstrained(tp)
    if get_origin(tp) in (Union, UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        first = options[0]
        if len(options) < len(get_args(tp)) and first is not str and get_origin(first) not in (list, dict):
            return None
        return _empty(first)
    if get_origin(tp) is Literal:
        return get_args(tp)[0]
    struct = _struct_type(tp)
    if struct is not None:
        return struct(**{f.name: _empty(f.type) for f in msgspec.structs.fields(struct) if f.required})
    return (get_origin(tp) or tp)()


def _unconstrained(tp: Any) -> Any:
    """`tp` without its `Annotated[..., Meta(...)]` limits, at any depth of unions, lists and tables."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _unconstrained(get_args(tp)[0])
    if origin in (Union, UnionType):
        return functools.reduce(operator.or_, [_unconstrained(a) for a in get_args(tp)])
    if origin in (list, frozenset, dict):
        return origin[tuple(_unconstrained(a) for a in get_args(tp))]
    return tp


def _optional_of(tp: Any) -> Any:
    """`X` for `X | None`, None for a union of several types, `tp` for any other type."""
    if get_origin(tp) in (Union, UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        return options[0] if len(options) == 1 else None
    return tp


def _literal_choices(tp: Any) -> tuple[str, ...]:
    """The strings a `Literal[...]` (or an optional one) allows; () for any other type."""
    tp = _optional_of(tp)
    if get_origin(tp) is Literal:
        return tuple(str(choice) for choice in get_args(tp))
    return ()


def _did_you_mean(typed: str, known: Iterable[str]) -> str:
    """` (did you mean 'X'?)` for the closest of `known` to a mistyped key or value, or "" when none is close."""
    close = difflib.get_close_matches(typed, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: A TOML bare key; any other key is written quoted in a problem's path.
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _struct_type(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct `tp` is, or is optionally (`X | None`); None otherwise."""
    tp = _optional_of(tp)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    return None


def _list_item_type(tp: Any) -> Any:
    return get_args(tp)[0] if get_origin(tp) is list else None
