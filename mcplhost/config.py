"""The configuration file: TOML decoded into frozen, strict msgspec Structs.

Strict where a person typed it: unknown keys are errors, and `problems` lists
every problem at once as ``path.to.field: what is wrong`` (msgspec alone stops
at the first). Relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec
from msgspec import Meta

from .errors import ConfigError
from .rpc.framing import MAX_LINE_BYTES
from .rpc.session import DEFAULT_TIMEOUT_S
from .store.db import DEFAULT_SYNCHRONOUS, SYNCHRONOUS_LEVELS

Seconds = Annotated[float, Meta(gt=0)]
NonEmpty = Annotated[str, Meta(min_length=1)]


class Base(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Typos fail loudly (forbid_unknown_fields); instances are safe to share (frozen)."""


class StoreConfig(Base):
    path: NonEmpty = "mcplhost.db"
    # NORMAL survives a killed host process (WAL); FULL also survives power loss.
    synchronous: Literal[SYNCHRONOUS_LEVELS] = DEFAULT_SYNCHRONOUS  # type: ignore[valid-type]


class RestartConfig(Base):
    policy: Literal["always", "on-failure", "never"] = "on-failure"
    backoff_initial_s: Seconds = 0.5
    backoff_max_s: Seconds = 30.0
    burst: Annotated[int, Meta(ge=1)] = 5
    window_s: Seconds = 60.0


class FeatureSetSelection(Base):
    enabled: list[NonEmpty] | None = None  # None: selection not restricted
    disabled: list[NonEmpty] = []


class ConnectorConfig(Base):
    name: NonEmpty
    command: Annotated[list[NonEmpty], Meta(min_length=1)]
    env: dict[str, str] = {}
    cwd: str | None = None
    grant: list[NonEmpty] = []
    request_timeout_s: Seconds = DEFAULT_TIMEOUT_S
    protocol: Literal["auto", "0.5", "0.4"] = "auto"
    channels: list[NonEmpty] | None = None  # globs on channel ids; None: any
    feature_sets: FeatureSetSelection = FeatureSetSelection()
    accept_tag_implications: bool = False
    restart: RestartConfig = RestartConfig()
    # Extensions beyond INTERFACES.md (documented in the README):
    policy_timeout_s: Seconds = 15.0  # wait for the initial featureSets/update receipt
    policy_fallback: Literal["mcp-only", "close"] = "mcp-only"  # when that receipt never comes
    stop_grace_s: Annotated[float, Meta(ge=0)] = 2.0  # after closing stdin, before SIGTERM
    term_grace_s: Annotated[float, Meta(ge=0)] = 3.0  # after SIGTERM, before SIGKILL
    max_line_bytes: Annotated[int, Meta(ge=1024)] = MAX_LINE_BYTES


class BackendConfig(Base):
    kind: Literal["scripted", "openai", "anthropic"] = "scripted"
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    timeout_s: Seconds = 60.0
    script: list[str] = []  # scripted: the replies, in turn


class AgentConfig(Base):
    name: NonEmpty
    parent: NonEmpty | None = None
    wake_on: list[NonEmpty] = msgspec.field(default_factory=lambda: ["addressed", "dm"])
    debounce_ms: Annotated[int, Meta(ge=0)] = 300
    backend: BackendConfig = BackendConfig()


class Config(Base):
    store: StoreConfig = StoreConfig()
    connectors: list[ConnectorConfig] = []
    agents: list[AgentConfig] = []


# --- loading -----------------------------------------------------------------


def default_config_path() -> Path:
    return Path(os.environ.get("MCPLHOST_CONFIG") or "mcplhost.toml")


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read, validate and resolve a config file; raise ConfigError listing every problem."""
    return read_config(path)[0]


def read_config(path: str | os.PathLike[str]) -> tuple[Config, list[str]]:
    """Like `load_config`, and also the warnings: things that are allowed but surely not meant."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a config file")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigMissing(path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    found = problems(raw)
    if not found:
        config = resolve_paths(msgspec.convert(raw, Config), path.resolve().parent)
        found = environment_problems(config)
    if found:
        raise ConfigError(f"{path}: {len(found)} problem(s)", problems=found)
    return config, warnings(raw)


class ConfigMissing(ConfigError):
    """The config file does not exist (the caller knows whether a hint about --config helps)."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path}: no such file")
        self.path = path


def resolve_paths(config: Config, base: Path) -> Config:
    """Make `store.path` and every `cwd` absolute, relative to `base`."""
    store = msgspec.structs.replace(config.store, path=str(base / config.store.path))
    connectors = [
        msgspec.structs.replace(c, cwd=str(base / c.cwd) if c.cwd is not None else str(base))
        for c in config.connectors
    ]
    return msgspec.structs.replace(config, store=store, connectors=connectors)


def problems(raw: Any) -> list[str]:
    """Every problem in a decoded TOML document, as ``path: what is wrong``."""
    return _check(raw, Config, "") + _cross_field(raw if isinstance(raw, dict) else {})


def _entries(raw: dict[str, Any], kind: str) -> list[tuple[int, dict[str, Any]]]:
    items = raw.get(kind)
    if not isinstance(items, list):
        return []
    return [(i, item) for i, item in enumerate(items) if isinstance(item, dict)]


def _cross_field(raw: dict[str, Any]) -> list[str]:
    """Rules across fields, read defensively so they run beside the type checks."""
    found: list[str] = []
    for kind in ("connectors", "agents"):
        seen: dict[str, int] = {}
        for i, item in _entries(raw, kind):
            name = item.get("name")
            if not isinstance(name, str):
                continue
            if name in seen:
                found.append(f"{kind}[{i}].name: {name!r} is already used by {kind}[{seen[name]}]")
            seen.setdefault(name, i)
    for i, connector in _entries(raw, "connectors"):
        grant = connector.get("grant")
        for j, pattern in enumerate(grant if isinstance(grant, list) else []):
            if isinstance(pattern, str) and pattern:
                found += [f"connectors[{i}].grant[{j}]: {why}" for why in grant_pattern_problems(pattern)]
    connector_names = {c.get("name") for _, c in _entries(raw, "connectors") if isinstance(c.get("name"), str)}
    for i, agent in _entries(raw, "agents"):
        wake_on = agent.get("wake_on")
        for j, entry in enumerate(wake_on if isinstance(wake_on, list) else []):
            if isinstance(entry, str) and entry:
                found += [f"agents[{i}].wake_on[{j}]: {why}" for why in wake_on_problems(entry, connector_names)]
    agents = _entries(raw, "agents")
    parents = {a.get("name"): a.get("parent") for _, a in agents}
    for i, agent in agents:
        parent = agent.get("parent")
        if not isinstance(parent, str) or not parent:
            continue
        if parent not in parents:
            found.append(f"agents[{i}].parent: no agent is named {parent!r}")
            continue
        chain, cursor = {agent.get("name")}, parent
        while isinstance(cursor, str):
            if cursor in chain:
                found.append(f"agents[{i}].parent: the parent chain of {agent.get('name')!r} loops")
                break
            chain.add(cursor)
            cursor = parents.get(cursor)
    return found


#: One segment of a grant pattern that is not `*`: a capability name (grants.py matches them literally).
_GRANT_SEGMENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
#: The `wake_on` keywords of AGENTS.md §2; any other entry names a connector (NAME or NAME/GLOB).
WAKE_ON_KEYWORDS = ("all", "addressed", "dm", "push")


def grant_pattern_problems(pattern: str) -> list[str]:
    """What is wrong with a grant pattern: each dot-separated segment is `*` or a capability name."""
    segments = pattern.split(".")
    if "" in segments:
        return [f"{pattern!r} has an empty segment"]
    bad = [s for s in segments if s != "*" and not _GRANT_SEGMENT.match(s)]
    if bad:
        return [f"{pattern!r}: segment {bad[0]!r} is neither * nor a capability name "
                "(* stands for exactly one segment; there is no ** or partial wildcard)"]
    return []


def wake_on_problems(entry: str, connector_names: set[str]) -> list[str]:
    """What is wrong with a `wake_on` entry: a keyword, a connector NAME, or NAME/GLOB."""
    if entry in WAKE_ON_KEYWORDS:
        return []
    name, slash, glob = entry.partition("/")
    if name in connector_names:
        return [f"{entry!r}: the channel glob after {name + '/'!r} is empty"] if slash and not glob else []
    choices = ", ".join(WAKE_ON_KEYWORDS)
    if slash:
        return [f"{entry!r}: no connector is named {name!r} (NAME/GLOB needs a configured connector)"]
    return [f"{entry!r} is not one of {choices}, nor a configured connector's name (or NAME/GLOB)"]


def warnings(raw: Any) -> list[str]:
    """Allowed but surely not meant: as ``path: what``, like problems."""
    found: list[str] = []
    for i, connector in _entries(raw if isinstance(raw, dict) else {}, "connectors"):
        if not connector.get("grant"):
            found.append(f"connectors[{i}].grant: empty: no item from this connector will ever be accepted")
    return found


# --- the machine the config names ----------------------------------------------


def environment_problems(config: Config) -> list[str]:
    """What the resolved config names that is not there: the database's folder, commands, cwds."""
    found = [f"store.path: {why}" for why in database_path_problems(Path(config.store.path))]
    for i, connector in enumerate(config.connectors):
        cwd = Path(connector.cwd) if connector.cwd is not None else None
        if cwd is not None and not cwd.is_dir():
            found.append(f"connectors[{i}].cwd: {cwd} " + ("is not a folder" if cwd.exists() else "does not exist"))
            continue
        why = command_problem(connector.command[0], cwd, connector.env)
        if why:
            found.append(f"connectors[{i}].command: {why}")
    return found


def database_path_problems(path: Path) -> list[str]:
    """Why the daemon could not create or use a database at `path` (its folder is never created for it)."""
    if str(path) == "":
        return ["empty path"]
    if path.is_dir():
        return [f"{path} is a directory, not a database file"]
    folder = path.parent
    if not folder.exists():
        return [f"the folder {folder} does not exist (create it; under systemd StateDirectory= does)"]
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    return []


def command_problem(program: str, cwd: Path | None, env: dict[str, str]) -> str | None:
    """Why `program` would not start: a path (relative to cwd) or a name looked up on PATH."""
    if "/" in program:
        target = Path(program) if cwd is None else cwd / program
        if not target.exists():
            return f"{program!r} does not exist" + (f" (relative to {cwd})" if not Path(program).is_absolute() else "")
        if target.is_dir() or not os.access(target, os.X_OK):
            return f"{program!r} is not an executable file"
        return None
    # The child's PATH decides (subprocess searches the environment it is given).
    search = env.get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(program, path=search) is None:
        return f"{program!r} is not found on PATH ({search}); give its full path"
    return None


def _check(value: Any, expected: Any, path: str) -> list[str]:
    """Check `value` against a type, descending into Structs and lists to report all."""
    struct = _struct_type(expected)
    if struct is not None and isinstance(value, dict):
        return _check_struct(value, struct, path)
    inner = _list_item_type(expected)
    if inner is not None and _struct_type(inner) is not None and isinstance(value, list):
        found: list[str] = []
        for i, item in enumerate(value):
            found += _check(item, inner, f"{path}[{i}]")
        return found
    if get_origin(expected) is dict and isinstance(value, dict):
        # msgspec says only `$[...]` for a bad table value; name its key as TOML would.
        _, value_type = get_args(expected)
        found = []
        for key, item in value.items():
            name = key if _BARE_KEY.match(key) else json.dumps(key)
            found += _check(item, value_type, f"{path}.{name}")
        return found
    try:
        msgspec.convert(value, expected)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `$")
        return [f"{path}{where.rstrip('`') or ''}: {message}" if path or where else f"(top level): {message}"]
    return []


def _check_struct(value: dict[str, Any], struct: type[msgspec.Struct], path: str) -> list[str]:
    found: list[str] = []
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    prefix = f"{path}." if path else ""
    for key in value:
        if key not in fields:
            found.append(f"{prefix}{key}: unknown key")
    for name, field in fields.items():
        if name not in value:
            if field.required:
                found.append(f"{prefix}{name}: required")
            continue
        found += _check(value[name], field.type, f"{prefix}{name}")
    return found


#: A TOML bare key; any other key is written quoted in a problem's path.
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _struct_type(tp: Any) -> type[msgspec.Struct] | None:
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    return None


def _list_item_type(tp: Any) -> Any:
    return get_args(tp)[0] if get_origin(tp) is list else None
