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
from collections.abc import Callable, Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from .envfile import NAME as ENV_NAME
from .envfile import EnvFileError, read_env_file
from .errors import ConfigError
from .rpc.framing import MAX_LINE_BYTES
from .rpc.session import DEFAULT_TIMEOUT_S
from .secrets import MIN_SECRET_CHARS
from .store.db import DEFAULT_SYNCHRONOUS, SYNCHRONOUS_LEVELS

Seconds = Annotated[float, Meta(gt=0)]
NonEmpty = Annotated[str, Meta(min_length=1)]


class Base(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Typos fail loudly (forbid_unknown_fields); instances are safe to share (frozen)."""


class StoreConfig(Base):
    path: NonEmpty = "mcplhost.db"
    # NORMAL survives a killed host process (WAL); FULL also survives power loss.
    synchronous: Literal[SYNCHRONOUS_LEVELS] = DEFAULT_SYNCHRONOUS  # type: ignore[valid-type]
    #: Prune items older than this many days (0: keep everything); never one still needed (docs/operations.md).
    retention_days: Annotated[int, Meta(ge=0)] = 0


#: The control socket's file name when `[control] socket` is not set: beside the database.
DEFAULT_CONTROL_SOCKET = "mcplhost.sock"


class ControlConfig(Base):
    """`[control]`: the Unix socket `mcplhost status` and `restart-connector` talk to (mode 0600, never TCP)."""

    socket: NonEmpty = DEFAULT_CONTROL_SOCKET  # relative to the database's folder


class MetricsConfig(Base):
    """`[metrics]`: Prometheus text format at /metrics, off unless `listen` is set (host:port; loopback by default)."""

    listen: NonEmpty | None = None


def listen_address(listen: str) -> tuple[str, int]:
    """`[metrics] listen` as (host, port): `HOST:PORT`, an IPv6 host in brackets (`[::1]:9464`).

    Always both parts, so the address bound is the one written (docs/operations.md#metrics);
    ValueError saying what is wrong otherwise.
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{listen!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c in host for c in "[]/ ") or (":" in host and not listen.startswith("[")):
        raise ValueError(f"{listen!r} is not HOST:PORT (an IPv6 host in brackets: [::1]:9464)")
    if not (port.isascii() and port.isdigit() and int(port) < 65536):
        raise ValueError(f"{listen!r}: the port must be a number from 0 to 65535 (0: any free port, logged)")
    return host, int(port)


#: Per-connector quotas' defaults (docs/operations.md#quotas): the bytes quota bounds the bodies stored; the items
#: quota bounds what it does not count, each row's metadata and index entries (about 1 KB an item), to the same
#: order (about 1 GB an hour), which is also ~280 items a second all hour: far above a busy connector's rate.
DEFAULT_MAX_ITEMS_PER_HOUR = 1_000_000
DEFAULT_MAX_BYTES_PER_HOUR = 1 << 30  # stored body bytes (1 GiB)
#: How long a `ping` may go unanswered before the connector counts as deaf (and is restarted).
DEFAULT_PING_TIMEOUT_S = 10.0


class RestartConfig(Base):
    policy: Literal["always", "on-failure", "never"] = "on-failure"
    backoff_initial_s: Seconds = 0.5
    backoff_max_s: Seconds = 30.0
    burst: Annotated[int, Meta(ge=1)] = 5
    window_s: Seconds = 60.0


class FeatureSetSelection(Base):
    enabled: list[NonEmpty] | None = None  # None: selection not restricted
    disabled: list[NonEmpty] = []


#: A variable name in `env_pass`: the rule env files follow too.
EnvName = Annotated[str, Meta(pattern=f"^{ENV_NAME.pattern}$")]


class ConnectorConfig(Base):
    name: NonEmpty
    command: Annotated[list[NonEmpty], Meta(min_length=1)]
    env: dict[str, str] = {}  # added to the child's environment (docs/connectors.md §10)
    env_pass: list[EnvName] = []  # host variables passed through by name
    env_file: NonEmpty | None = None  # KEY=VALUE lines read at each spawn (mcplhost/envfile.py); relative to the config
    cwd: str | None = None
    grant: list[NonEmpty] = []
    request_timeout_s: Seconds = DEFAULT_TIMEOUT_S
    protocol: Literal["auto", "0.5", "0.4"] = "auto"
    channels: list[NonEmpty] | None = None  # globs on channel ids; None: any
    feature_sets: FeatureSetSelection = FeatureSetSelection()
    accept_tag_implications: bool = False
    #: Ready with no inbound item for longer than this: flagged quiet (None: never).
    expect_traffic_within_s: Seconds | None = None
    #: Send MCP `ping` this often (None: never); no answer within ping_timeout_s: restarted as deaf.
    ping_interval_s: Seconds | None = None
    ping_timeout_s: Seconds = DEFAULT_PING_TIMEOUT_S
    #: Quotas counted in the store over a sliding hour; past either, messages are refused with reason `quota`.
    max_items_per_hour: Annotated[int, Meta(ge=1)] = DEFAULT_MAX_ITEMS_PER_HOUR
    max_bytes_per_hour: Annotated[int, Meta(ge=1)] = DEFAULT_MAX_BYTES_PER_HOUR
    restart: RestartConfig = RestartConfig()
    # Extensions of our own (README.md#configuration-reference):
    policy_timeout_s: Seconds = 15.0  # wait for the initial featureSets/update receipt
    policy_fallback: Literal["mcp-only", "close"] = "mcp-only"  # when that receipt never comes
    stop_grace_s: Annotated[float, Meta(ge=0)] = 2.0  # after closing stdin, before SIGTERM
    term_grace_s: Annotated[float, Meta(ge=0)] = 3.0  # after SIGTERM, before SIGKILL
    max_line_bytes: Annotated[int, Meta(ge=1024)] = MAX_LINE_BYTES
    #: Render the host's `from: NAME (ID)` line under the header of this connector's items in agents' context
    #: (docs/agents.md#who-said-what); false when the connector's text already names its author.
    author_line: bool = True
    #: Derived when the file is loaded, never written in it: every `api_key_env` of the config, which no
    #: connector's environment may hold (`DERIVED_FIELDS`).
    withheld_env: frozenset[str] = frozenset()


#: Fields filled in by `resolve`, not read from TOML: a file that sets one has an unknown key.
DERIVED_FIELDS = frozenset({"withheld_env"})


class ScriptToolCall(Base):
    """A tool call a scripted reply makes: the tool's name and its arguments object."""

    name: NonEmpty
    arguments: dict[str, Any] = {}


class ScriptReply(Base):
    """A scripted reply written as a TOML table: prose and the tool calls after it (docs/agents.md#backends)."""

    text: str = ""
    tool_calls: list[ScriptToolCall] = []


class BackendConfig(Base):
    """One model backend ([agents.backend], [inference.backend]); docs/agents.md#backends."""

    kind: Literal["scripted", "openai", "anthropic"] = "scripted"
    model: NonEmpty | None = None  # required for openai and anthropic (problems() says so)
    base_url: NonEmpty | None = None  # handed to the SDK unchanged; `base_url_problem` says what it refuses
    api_key_env: NonEmpty | None = None  # the variable's name, never the key
    max_tokens: Annotated[int, Meta(ge=1)] = 1024
    timeout_s: Seconds = 60.0  # per attempt
    max_retries: Annotated[int, Meta(ge=0)] = 2  # the SDK's own retries
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    #: scripted: the replies, in turn (the last repeats). A string is used as written ("{{echo}}" is the
    #: waking body; a JSON object string is a reply with tool calls); a table is a `ScriptReply`.
    script: list[str | ScriptReply] = []


#: docs/agents.md#scheduling: `max_wait_ms` when absent is the larger of this and DEBOUNCE_WAIT_FACTOR × debounce_ms.
DEFAULT_MAX_WAIT_MS = 3000
DEBOUNCE_WAIT_FACTOR = 4
DEFAULT_DEBOUNCE_MS = 300


#: What a stop command is when `stop_commands` is not set: compared trimmed and case-folded.
DEFAULT_STOP_COMMANDS = ("!stop", "/stop")


class AgentConfig(Base):
    """One `[[agents]]` table; docs/agents.md is the rule for every key."""

    name: NonEmpty
    parent: NonEmpty | None = None
    title: str | None = None
    hears: list[NonEmpty] | None = None  # connectors or connector/channel-globs; None: every connector
    wake_on: list[NonEmpty] = msgspec.field(default_factory=lambda: ["addressed", "dm"])
    wake_from: list[NonEmpty] | None = None  # connector/author-id globs; None: anyone
    wake_from_bots: bool = False
    max_wakes_per_sender_per_hour: Annotated[int, Meta(ge=1)] = 30
    context_scope: Literal["agent", "conversation"] = "agent"
    tools: list[NonEmpty] | None = None  # globs over tool names; None: all
    tool_timeout_s: Seconds = 60.0
    tool_result_max_chars: Annotated[int, Meta(ge=1)] = 20_000
    max_tokens_per_day: Annotated[int, Meta(ge=0)] = 0  # 0: no limit
    publish_max_age_s: Seconds = 3600.0
    debounce_ms: Annotated[int, Meta(ge=0)] = DEFAULT_DEBOUNCE_MS
    max_wait_ms: Annotated[int, Meta(ge=0)] | None = None  # None: effective_max_wait_ms decides
    system_prompt: str | None = None
    system_prompt_file: NonEmpty | None = None  # relative to the config file's folder
    context_chars: Annotated[int, Meta(ge=1)] = 120_000
    max_tool_rounds: Annotated[int, Meta(ge=0)] = 8
    max_turns_per_hour: Annotated[int, Meta(ge=1)] = 120
    catch_up_max_age_s: Annotated[float, Meta(ge=0)] = 3600.0  # 0: no catch-up
    #: docs/agents.md#steering: a reaction sent with `channels/acknowledge` on each waking addressed item ("": off).
    ack_reaction: str = ""
    #: connector/author-id globs whose stop commands this agent obeys (none by default).
    control_from: list[NonEmpty] = []
    stop_commands: list[NonEmpty] = msgspec.field(default_factory=lambda: list(DEFAULT_STOP_COMMANDS))
    #: Published once to the decided route when a turn fails ("": off).
    failure_reply: str = ""
    backend: BackendConfig = BackendConfig()


def effective_max_wait_ms(agent: AgentConfig) -> int:
    """How long after the first pending waking item a turn starts at the latest (docs/agents.md#scheduling)."""
    if agent.max_wait_ms is not None:
        return agent.max_wait_ms
    return max(DEFAULT_MAX_WAIT_MS, DEBOUNCE_WAIT_FACTOR * agent.debounce_ms)


def system_prompt_text(agent: AgentConfig) -> str:
    """The agent's own prompt: `system_prompt`, or the file's text (read now, so an edit counts), or "".

    Raises OSError or UnicodeDecodeError when the file has become unreadable
    since check-config (the turn then fails with its notice).
    """
    if agent.system_prompt_file is not None:
        return Path(agent.system_prompt_file).read_text(encoding="utf-8")
    return agent.system_prompt or ""


class InferenceConfig(Base):
    """`[inference]`: the backend serving connectors' inference/request and model/info (docs/agents.md#inference)."""

    backend: BackendConfig
    context_window: Annotated[int, Meta(ge=1)] = 128_000


class ModerationConfig(Base):
    """`[moderation]`: every outgoing segment is checked before it is queued, fail-closed (docs/agents.md#moderation).

    `command`: an executable given `{"text", "agent", "destination"}` as JSON
    on stdin, answering `{"allow": bool, "reason": str}` on stdout. `openai`:
    the official SDK's moderations endpoint (`model`, `base_url`, `api_key_env`
    as in a backend).
    """

    kind: Literal["command", "openai"]
    command: Annotated[list[NonEmpty], Meta(min_length=1)] | None = None  # kind "command" only
    timeout_s: Seconds = 5.0
    model: NonEmpty | None = None  # kind "openai": default DEFAULT_MODERATION_MODEL
    base_url: NonEmpty | None = None
    api_key_env: NonEmpty | None = None


#: The moderation model asked for when `[moderation] model` is not set (kind "openai").
DEFAULT_MODERATION_MODEL = "omni-moderation-latest"


class Config(Base):
    store: StoreConfig = StoreConfig()
    connectors: list[ConnectorConfig] = []
    agents: list[AgentConfig] = []
    inference: InferenceConfig | None = None
    control: ControlConfig = ControlConfig()
    metrics: MetricsConfig = MetricsConfig()
    moderation: ModerationConfig | None = None


def control_socket_path(config: Config) -> Path:
    """Where the control socket is: `[control] socket`, relative to the database's folder (after `resolve`)."""
    return Path(config.store.path).parent / config.control.socket


# --- loading -----------------------------------------------------------------


def default_config_path() -> Path:
    return Path(os.environ.get("MCPLHOST_CONFIG") or "mcplhost.toml")


#: Why a well-formed grant pattern names no capability, or None when it names one. The capability
#: vocabulary belongs to the protocol layer, which sits above config (docs/architecture.md#layers), so
#: config never imports it: whoever loads a config for the host passes
#: `mcplhost.protocol.grants.unknown_grant_problem` in (mcplhost/cli/ does, for check-config and run), and its
#: answer is listed in place, as `connectors[i].grant[j]: ...`, with every other problem. Without it
#: only a pattern's form is checked.
UnknownGrant = Callable[[str], str | None]


def load_config(path: str | os.PathLike[str], *, unknown_grant: UnknownGrant | None = None) -> Config:
    """Read, validate and resolve a config file; raise ConfigError listing every problem."""
    return read_config(path, unknown_grant=unknown_grant)[0]


def read_config(path: str | os.PathLike[str], *, start_problems: bool = True,
                unknown_grant: UnknownGrant | None = None) -> tuple[Config, list[str]]:
    """Like `load_config`, and also the warnings: things that are allowed but surely not meant.

    Every check runs in one pass (types, cross-field rules, the files and
    commands it names), so one run lists every problem; a check that needs a
    value another check found wrong is skipped, not the rest. With
    `start_problems=False` (`run`), what stops one connector from starting (a
    missing command, cwd or env file) is left to that connector: it fails its
    spawn and is retried by its restart policy, while the others run.
    `unknown_grant`: the vocabulary check of grant patterns (`UnknownGrant`).
    """
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
    base = path.resolve().parent
    fatal, per_connector = machine_problems(raw, base)
    found = problems(raw, unknown_grant=unknown_grant) + fatal + (per_connector if start_problems else [])
    if found:
        raise ConfigError(f"{path}: {len(found)} problem(s)", problems=found)
    config = resolve(msgspec.convert(raw, Config), base, withheld=frozenset(api_key_variables(raw)))
    return config, warnings(raw) + environment_warnings(config)


class ConfigMissing(ConfigError):
    """The config file does not exist (the caller knows whether a hint about --config helps)."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path}: no such file")
        self.path = path


def resolve(config: Config, base: Path, *, withheld: frozenset[str] = frozenset()) -> Config:
    """Make every path absolute, relative to `base`, and give each connector the variables it never gets.

    Paths: `store.path`, every `cwd` and `env_file`, every `system_prompt_file`, a `[moderation] command` path.
    `withheld`: the host's api key variables (`api_key_variables`).
    """
    store = msgspec.structs.replace(config.store, path=str(base / config.store.path))
    connectors = [
        msgspec.structs.replace(c, cwd=str(base / c.cwd) if c.cwd is not None else str(base),
                                env_file=str(base / c.env_file) if c.env_file is not None else None,
                                withheld_env=withheld)
        for c in config.connectors
    ]
    agents = [
        msgspec.structs.replace(a, system_prompt_file=str(base / a.system_prompt_file))
        if a.system_prompt_file is not None else a
        for a in config.agents
    ]
    moderation = config.moderation
    if moderation is not None and moderation.command is not None and "/" in moderation.command[0]:
        program = str(base / moderation.command[0])  # a path is relative to the config's folder, like check-config's
        moderation = msgspec.structs.replace(moderation, command=[program, *moderation.command[1:]])
    return msgspec.structs.replace(config, store=store, connectors=connectors, agents=agents, moderation=moderation)


def api_key_places(config: Config) -> list[tuple[str, str]]:
    """Where a loaded config names the host's own api keys, as (path of the `api_key_env`, variable name).

    The same places `api_key_variables` reads in the raw document: agents' backends, `[inference]`,
    `[moderation]`.
    """
    places = [(f"agents[{i}].backend.api_key_env", a.backend.api_key_env) for i, a in enumerate(config.agents)]
    if config.inference is not None:
        places.append(("inference.backend.api_key_env", config.inference.backend.api_key_env))
    if config.moderation is not None:
        places.append(("moderation.api_key_env", config.moderation.api_key_env))
    return [(where, name) for where, name in places if name is not None]


def api_key_variables(raw: dict[str, Any]) -> dict[str, str]:
    """The variables holding the host's own api keys, each with where it is named, read defensively.

    Every `api_key_env` of an agent's backend, of `[inference]`'s and of `[moderation]`: the one
    list of where the host keeps keys, which connectors never get.
    """
    places: list[tuple[str, Any]] = [(f"agents[{i}].backend", a.get("backend")) for i, a in _entries(raw, "agents")]
    inference = raw.get("inference")
    if isinstance(inference, dict):
        places.append(("inference.backend", inference.get("backend")))
    places.append(("moderation", raw.get("moderation")))
    found: dict[str, str] = {}
    for where, table in places:
        name = table.get("api_key_env") if isinstance(table, dict) else None
        if isinstance(name, str) and name:
            found.setdefault(name, f"{where}.api_key_env")
    return found


#: A connector variable whose name holds one of these (upper-cased first, so `discord_token` counts) is a secret.
SECRET_NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def secret_name(name: str) -> bool:
    """Whether a connector's variable is secret by its name (docs/agents.md#secrets)."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def secret_sources(config: Config, environ: Mapping[str, str] = os.environ) -> dict[str, tuple[str, str]]:
    """Every secret variable's value with where it is named, as {name: (value, path)}; unset ones left out.

    The values of every `api_key_env` (agents' backends, `[inference]`,
    `[moderation]`) and every connector variable whose name is secret
    (`secret_name`): in `env`, in `env_pass` (from `environ`) and in the
    `env_file` (read now; unreadable: skipped, `check-config` reports it).
    Short values are kept here, for the warning; `Secrets` drops them.
    """
    found: dict[str, tuple[str, str]] = {}
    for where, name in api_key_places(config):
        if environ.get(name):
            found.setdefault(name, (environ[name], where))
    for i, connector in enumerate(config.connectors):
        for name, found_at in connector_secret_sources(connector, environ, where=f"connectors[{i}]").items():
            found.setdefault(name, found_at)
    return found


def connector_secret_sources(connector: ConnectorConfig, environ: Mapping[str, str] = os.environ, *,
                             where: str = "") -> dict[str, tuple[str, str]]:
    """One connector's secret variables (`secret_sources`), its `env_file` read now: as its spawn reads it."""
    own: dict[str, str] = {}
    if connector.env_file is not None:
        try:
            own = read_env_file(connector.env_file)
        except EnvFileError:
            own = {}  # its spawn fails the same way (docs/operations.md#connector-environments-and-secrets)
    named = [(f"env.{k}", k, v) for k, v in connector.env.items()]
    named += [(f"env_pass[{j}]", k, environ[k]) for j, k in enumerate(connector.env_pass) if k in environ]
    named += [("env_file", k, v) for k, v in own.items()]
    return {name: (value, f"{where}.{field}") for field, name, value in reversed(named)
            if secret_name(name) and value}


def secret_values(config: Config, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The secret values the host withholds and redacts, by variable name (docs/agents.md#secrets)."""
    return {name: value for name, (value, _where) in secret_sources(config, environ).items()}


def short_secret_warnings(config: Config, environ: Mapping[str, str] = os.environ) -> list[str]:
    """A secret variable whose value is too short to be redacted, as ``path: what`` (never the value)."""
    return [f"{where}: the value of {name} is shorter than {MIN_SECRET_CHARS} characters: it is not treated as a"
            " secret (never withheld, never redacted)"
            for name, (value, where) in secret_sources(config, environ).items() if len(value) < MIN_SECRET_CHARS]


def problems(raw: Any, *, unknown_grant: UnknownGrant | None = None) -> list[str]:
    """Every problem in a decoded TOML document, as ``path: what is wrong``.

    Grant patterns are checked against the capability vocabulary only with `unknown_grant` (`UnknownGrant`).
    """
    return _check(raw, Config, "") + _cross_field(raw if isinstance(raw, dict) else {}, unknown_grant)


def _entries(raw: dict[str, Any], kind: str) -> list[tuple[int, dict[str, Any]]]:
    items = raw.get(kind)
    if not isinstance(items, list):
        return []
    return [(i, item) for i, item in enumerate(items) if isinstance(item, dict)]


def _cross_field(raw: dict[str, Any], unknown_grant: UnknownGrant | None) -> list[str]:
    """Rules across fields, read defensively so they run beside the type checks."""
    found: list[str] = []
    for kind in ("connectors", "agents"):
        seen: dict[str, int] = {}
        for i, item in _entries(raw, kind):
            name = item.get("name")
            if not isinstance(name, str) or not name:
                continue
            if not NAME_PATTERN.fullmatch(name):
                found.append(f"{kind}[{i}].name: {name!r} must match {NAME_PATTERN.pattern} "
                             "(a letter or digit, then up to 31 letters, digits, _ or -)")
            if name in seen:
                found.append(f"{kind}[{i}].name: {name!r} is already used by {kind}[{seen[name]}]")
            seen.setdefault(name, i)
    api_keys = api_key_variables(raw)
    for i, connector in _entries(raw, "connectors"):
        grant = connector.get("grant")
        for j, pattern in enumerate(grant if isinstance(grant, list) else []):
            if isinstance(pattern, str) and pattern:
                found += [f"connectors[{i}].grant[{j}]: {why}"
                          for why in grant_pattern_problems(pattern, unknown_grant)]
        found += [f"connectors[{i}].{why}" for why in withheld_name_problems(connector, api_keys)]
    connector_names = {c.get("name") for _, c in _entries(raw, "connectors") if isinstance(c.get("name"), str)}
    for i, agent in _entries(raw, "agents"):
        found += [f"agents[{i}].{why}" for why in agent_problems(agent, connector_names)]
    found += _parent_problems(_entries(raw, "agents"))
    metrics = raw.get("metrics")
    listen = metrics.get("listen") if isinstance(metrics, dict) else None
    if isinstance(listen, str) and listen:
        try:
            listen_address(listen)
        except ValueError as exc:
            found.append(f"metrics.listen: {exc}")
    inference = raw.get("inference")
    if isinstance(inference, dict) and isinstance(inference.get("backend"), dict):
        found += [f"inference.backend.{why}" for why in backend_problems(inference["backend"])]
    moderation = raw.get("moderation")
    if isinstance(moderation, dict):
        found += [f"moderation.{why}" for why in moderation_problems(moderation)]
    return found


#: The `[moderation]` keys only kind "openai" reads (kind "command" refuses them rather than ignore them).
OPENAI_MODERATION_KEYS = ("model", "base_url", "api_key_env")


def moderation_problems(moderation: dict[str, Any]) -> list[str]:
    """`[moderation]`'s cross-field problems: kind "command" needs `command`, each kind refuses the other's keys."""
    kind = moderation.get("kind")
    if kind == "command":
        found = [] if "command" in moderation else ['command: required for kind "command"']
        return found + [f'{key}: not used by kind "command" (only by kind "openai")'
                        for key in OPENAI_MODERATION_KEYS if key in moderation]
    if kind == "openai" and "command" in moderation:
        return ['command: not used by kind "openai" (it calls the moderations endpoint; set model, base_url, '
                'api_key_env)']
    return _base_url_problems(moderation) if kind == "openai" else []


def withheld_name_problems(connector: dict[str, Any], api_keys: Mapping[str, str]) -> list[str]:
    """A connector's `env_pass` or `env` naming a variable that holds one of the host's api keys."""
    found: list[str] = []

    def named(field: str, name: str) -> None:
        found.append(f"{field}: {name} holds an api key of this host (named by {api_keys[name]}); "
                     "connectors never get it: give the connector its own variable")

    for j, name in _strings(connector.get("env_pass")):
        if name in api_keys:
            named(f"env_pass[{j}]", name)
    env = connector.get("env")
    for name in env if isinstance(env, dict) else {}:
        if name in api_keys:
            named(f"env.{name}", name)
    return found


def _strings(value: Any) -> list[tuple[int, str]]:
    """The non-empty strings of a list, with their indexes (the type checks report the rest)."""
    return [(j, v) for j, v in enumerate(value if isinstance(value, list) else []) if isinstance(v, str) and v]


def agent_problems(agent: dict[str, Any], connector_names: set[str]) -> list[str]:
    """One agent table's cross-field problems, each as ``field: what is wrong`` (without the agent's path)."""
    found: list[str] = []
    for j, entry in _strings(agent.get("hears")):
        found += [f"hears[{j}]: {why}" for why in hears_problems(entry, connector_names)]
    for j, entry in _strings(agent.get("wake_on")):
        found += [f"wake_on[{j}]: {why}" for why in wake_on_problems(entry, connector_names)]
    for j, entry in _strings(agent.get("wake_from")):
        found += [f"wake_from[{j}]: {why}" for why in wake_from_problems(entry, connector_names)]
    for j, entry in _strings(agent.get("control_from")):
        found += [f"control_from[{j}]: {why}" for why in wake_from_problems(entry, connector_names)]
    if agent.get("system_prompt") is not None and agent.get("system_prompt_file") is not None:
        found.append("system_prompt_file: set together with system_prompt; give one of them")
    debounce, max_wait = agent.get("debounce_ms", DEFAULT_DEBOUNCE_MS), agent.get("max_wait_ms")
    if _is_int(debounce) and _is_int(max_wait) and max_wait < debounce:
        found.append(f"max_wait_ms: {max_wait} is less than debounce_ms ({debounce}); "
                     "a turn could never wait out its debounce")
    backend = agent.get("backend")
    if isinstance(backend, dict):
        found += [f"backend.{why}" for why in backend_problems(backend)]
    return found


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def backend_problems(backend: dict[str, Any]) -> list[str]:
    """A backend table's cross-field problems: a network backend names its model; its base_url can be used."""
    kind = backend.get("kind", "scripted")
    found = [f"model: required for kind {kind!r}"] if kind in ("openai", "anthropic") and backend.get("model") is None \
        else []
    return found + _base_url_problems(backend)


def _base_url_problems(table: dict[str, Any]) -> list[str]:
    url = table.get("base_url")
    why = base_url_problem(url) if isinstance(url, str) and url else None
    return [f"base_url: {why}"] if why else []


def base_url_problem(url: str) -> str | None:
    """Why a backend's `base_url` cannot be used, or None.

    The SDKs' HTTP client refuses a URL with a control character, a port that
    is not a number or an unclosed `[` in its constructor (the backend is never
    built: a start or a reload fails on it); a URL that is not absolute
    http(s) with a host fails every call. Both are refused here, the way
    check-config refuses everything else it can see.
    """
    if any(not ch.isprintable() or ch.isspace() for ch in url):
        return f"{url!r} holds a space or a control character"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - reading it is the check: a port outside 0-65535 or not a number raises
    except ValueError as exc:
        return f"{url!r} is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an absolute http:// or https:// URL with a host (e.g. http://127.0.0.1:8000/v1)"
    return None


#: Most ancestors an agent may have (its depth below its tree's root); docs/peers.md#trees.
MAX_TREE_DEPTH = 32


def _parent_problems(agents: list[tuple[int, dict[str, Any]]]) -> list[str]:
    """A parent names an agent of this file, following parents ends, and within MAX_TREE_DEPTH steps."""
    found: list[str] = []
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
            if len(chain) - 1 > MAX_TREE_DEPTH:
                found.append(f"agents[{i}].parent: {agent.get('name')!r} is more than {MAX_TREE_DEPTH} levels"
                             " below its tree's root")
                break
            cursor = parents.get(cursor)
    return found


#: Names of connectors and agents (docs/agents.md#wakes): they appear in headers, tool names and log fields.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
#: One segment of a grant pattern that is not `*`: a capability name (grants.py matches them literally).
_GRANT_SEGMENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
#: The `wake_on` keywords of docs/agents.md#scheduling; any other entry names a connector (NAME or NAME/GLOB).
WAKE_ON_KEYWORDS = ("all", "addressed", "dm", "push")


def grant_pattern_problems(pattern: str, unknown_grant: UnknownGrant | None = None) -> list[str]:
    """What is wrong with a grant pattern: each segment is `*` or a name, and (with `unknown_grant`) it names a
    capability the host knows; the vocabulary is asked only about a pattern of the right form."""
    segments = pattern.split(".")
    if "" in segments:
        return [f"{pattern!r} has an empty segment"]
    bad = [s for s in segments if s != "*" and not _GRANT_SEGMENT.match(s)]
    if bad:
        return [f"{pattern!r}: segment {bad[0]!r} is neither * nor a capability name "
                "(* stands for exactly one segment; there is no ** or partial wildcard)"]
    unknown = unknown_grant(pattern) if unknown_grant is not None else None
    return [unknown] if unknown is not None else []


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


def hears_problems(entry: str, connector_names: set[str]) -> list[str]:
    """What is wrong with a `hears` entry: a configured connector's NAME, or NAME/CHANNEL-GLOB."""
    name, slash, glob = entry.partition("/")
    if name not in connector_names:
        return [f"{entry!r}: no connector is named {name!r}"]
    return [f"{entry!r}: the channel glob after {name + '/'!r} is empty"] if slash and not glob else []


def wake_from_problems(entry: str, connector_names: set[str]) -> list[str]:
    """What is wrong with a `wake_from` entry: NAME/AUTHOR-ID-GLOB, NAME a configured connector."""
    name, slash, glob = entry.partition("/")
    if not slash or not glob:
        return [f"{entry!r}: needs the form connector/author-id-glob (matched on the author's id)"]
    if name not in connector_names:
        return [f"{entry!r}: no connector is named {name!r}"]
    return []


def warnings(raw: Any) -> list[str]:
    """Allowed but surely not meant: as ``path: what``, like problems."""
    raw = raw if isinstance(raw, dict) else {}
    found: list[str] = []
    for i, connector in _entries(raw, "connectors"):
        if not connector.get("grant"):
            found.append(f"connectors[{i}].grant: empty: no item from this connector will ever be accepted")
    for i, agent in _entries(raw, "agents"):
        found += [f"agents[{i}].{why}" for why in _agent_warnings(agent)]
    return found


def _agent_warnings(agent: dict[str, Any]) -> list[str]:
    found: list[str] = []
    hears = agent.get("hears")
    if isinstance(hears, list):
        heard = {h.partition("/")[0] for h in hears if isinstance(h, str)}
        for j, entry in _strings(agent.get("wake_on")):
            if entry not in WAKE_ON_KEYWORDS and entry.partition("/")[0] not in heard:
                found.append(f"wake_on[{j}]: {entry!r} names a connector the agent does not hear: it never wakes it")
        if not hears:
            found.append("hears: empty: the agent hears nothing and never wakes")
    backend = agent.get("backend")
    if isinstance(backend, dict) and backend.get("script") and backend.get("kind", "scripted") != "scripted":
        found.append(f"backend.script: ignored by kind {backend.get('kind')!r} (scripted only)")
    return found


def environment_warnings(config: Config, environ: Mapping[str, str] = os.environ) -> list[str]:
    """What the resolved config names in the environment that is not set now (it may be, under systemd)."""
    found: list[str] = []
    for where, name in api_key_places(config):
        if not environ.get(name):
            consequence = ("every check will fail, so every segment becomes a draft" if where.startswith("moderation")
                           else "calls will fail with missing_key")
            found.append(f"{where}: the variable {name} is not set here: {consequence}")
    for i, connector in enumerate(config.connectors):
        for j, name in enumerate(connector.env_pass):
            if name not in environ:
                found.append(f"connectors[{i}].env_pass[{j}]: the variable {name} is not set here: "
                             "the connector starts without it")
    return found + short_secret_warnings(config, environ)


# --- the machine the config names ----------------------------------------------


def machine_problems(raw: Any, base: Path) -> tuple[list[str], list[str]]:
    """What the config names that is not there, read defensively beside the type checks.

    Two lists: what stops the host (the database's folder, an agent's prompt
    file) and what stops only one connector from starting (its cwd, command
    or env file). A value of the wrong type is the type checks' to report:
    the checks that need it are skipped.
    """
    raw = raw if isinstance(raw, dict) else {}
    fatal: list[str] = []
    store = raw.get("store", {})
    db = store.get("path", StoreConfig().path) if isinstance(store, dict) else None
    if isinstance(db, str) and db:
        fatal += [f"store.path: {why}" for why in database_path_problems(base / db)]
    api_keys = api_key_variables(raw)
    starts: list[str] = []
    for i, connector in _entries(raw, "connectors"):
        starts += [f"connectors[{i}].{why}" for why in connector_start_problems(connector, base, api_keys)]
    for i, agent in _entries(raw, "agents"):
        prompt = agent.get("system_prompt_file")
        if isinstance(prompt, str) and prompt:
            try:
                (base / prompt).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                fatal.append(f"agents[{i}].system_prompt_file: cannot read {base / prompt}: "
                             f"{exc.strerror if isinstance(exc, OSError) else exc}")
    moderation = raw.get("moderation")
    command = moderation.get("command") if isinstance(moderation, dict) else None
    if isinstance(command, list) and command and isinstance(command[0], str) and command[0]:
        # Fatal: with its check missing, every segment would become a draft (fail-closed, docs/agents.md#moderation).
        why = command_problem(command[0], base, os.environ.get("PATH", os.defpath))
        if why:
            fatal.append(f"moderation.command: {why}")
    return fatal, starts


def connector_start_problems(connector: dict[str, Any], base: Path, api_keys: Mapping[str, str]) -> list[str]:
    """Why one connector would not start: its env file, its cwd, its command (as ``field: why``)."""
    found: list[str] = []
    own: dict[str, str] = {}
    env_file = connector.get("env_file")
    if isinstance(env_file, str) and env_file:
        try:
            own = read_env_file(base / env_file)
        except EnvFileError as exc:
            found.append(f"env_file: {exc}")
        for name in sorted(own.keys() & api_keys.keys()):
            found.append(f"env_file: {base / env_file} sets {name}, which holds an api key of this host "
                         f"(named by {api_keys[name]}); connectors never get it")
    cwd_value = connector.get("cwd")
    if cwd_value is not None and not isinstance(cwd_value, str):
        return found
    cwd = base / cwd_value if cwd_value is not None else base
    if not cwd.is_dir():
        return found + [f"cwd: {cwd} " + ("is not a folder" if cwd.exists() else "does not exist")]
    command, env = connector.get("command"), connector.get("env", {})
    if isinstance(command, list) and command and isinstance(command[0], str) and command[0] and isinstance(env, dict):
        # The child's PATH decides (subprocess searches the environment it is given): `env`, then the file, then ours.
        search = env.get("PATH") or own.get("PATH") or os.environ.get("PATH", os.defpath)
        why = command_problem(command[0], cwd, search if isinstance(search, str) else os.defpath)
        if why:
            found.append(f"command: {why}")
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


def command_problem(program: str, cwd: Path, search: str) -> str | None:
    """Why `program` would not start: a path (relative to cwd) or a name looked up on the PATH `search`."""
    if "/" in program:
        target = cwd / program
        if not target.exists():
            return f"{program!r} does not exist" + (f" (relative to {cwd})" if not Path(program).is_absolute() else "")
        if target.is_dir() or not os.access(target, os.X_OK):
            return f"{program!r} is not an executable file"
        return None
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
        if key not in fields or key in DERIVED_FIELDS:
            found.append(f"{prefix}{key}: unknown key")
    for name, field in fields.items():
        if name in DERIVED_FIELDS:
            continue
        if name not in value:
            if field.required:
                found.append(f"{prefix}{name}: required")
            continue
        found += _check(value[name], field.type, f"{prefix}{name}")
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
