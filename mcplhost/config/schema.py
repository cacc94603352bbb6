"""The config file's shape: frozen, strict msgspec Structs, their defaults and the constants they restate.

Strict where a person typed it: every Struct forbids unknown keys, and value
limits sit in the types (`Annotated[..., Meta(...)]`). Defaults that restate
another module's constant import it from its owner below config
(docs/architecture.md#layers). What one value or several together must
satisfy beyond their types is mcplhost/config/rules.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import Meta

from ..envfile import NAME as ENV_NAME
from ..rpc.limits import DEFAULT_TIMEOUT_S, MAX_LINE_BYTES
from ..store.db import DEFAULT_SYNCHRONOUS, SynchronousLevel
from ..store.open import DEFAULT_POOL_SIZE

Seconds = Annotated[float, Meta(gt=0)]


NonEmpty = Annotated[str, Meta(min_length=1)]


class Base(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Typos fail loudly (forbid_unknown_fields); instances are safe to share (frozen).

    Each subclass says `frozen=True` again: msgspec inherits it, type checkers do not (PEP 681).
    """


#: The most connections `[store] pool_size` may ask a host to hold (the default is the store's DEFAULT_POOL_SIZE).
MAX_POOL_SIZE = 100


class StoreConfig(Base, frozen=True):
    """`[store]`: an SQLite file (`path`) or a PostgreSQL server (`url`), exactly one (README.md#configuration-reference).

    With `url`, `path` keeps its default and means nothing: the host opens the URL (mcplhost/host.py
    `open_configured_store`).
    """

    path: NonEmpty = "mcplhost.db"
    #: postgresql:// or postgres:// (libpq's form); its password is a secret (mcplhost/config/environment.py).
    url: NonEmpty | None = None
    # NORMAL survives a killed host process (WAL); FULL also survives power loss. SQLite only.
    synchronous: SynchronousLevel = DEFAULT_SYNCHRONOUS
    #: PostgreSQL only: the connections this host holds.
    pool_size: Annotated[int, Meta(ge=1, le=MAX_POOL_SIZE)] = DEFAULT_POOL_SIZE
    #: Prune items older than this many days (0: keep everything); never one still needed (docs/operations.md).
    retention_days: Annotated[int, Meta(ge=0)] = 0
    #: Derived when the file is loaded, never written in it: the folder of the daemon's own files (its lock,
    #: the children file, the control socket by default). The database's folder for `path`; for `url`,
    #: $MCPLHOST_STATE_DIR or else the config's folder (`state_folder`). "": the database's folder.
    state_dir: str = ""




#: A host's name in a shared store (README.md#configuration-reference): in status, in the lock file's name.
MAX_HOST_NAME_CHARS = 64
HOST_NAME_PATTERN = rf"^[A-Za-z0-9._-]{{1,{MAX_HOST_NAME_CHARS}}}$"


class HostConfig(Base, frozen=True):
    """`[host]`: this host among the hosts that share one PostgreSQL store (docs/operations.md#a-postgresql-store)."""

    #: None: the machine's hostname (`default_host_name`), filled in when the file is loaded.
    name: Annotated[str, Meta(pattern=HOST_NAME_PATTERN)] | None = None


#: The control socket's file name when `[control] socket` is not set: in the state folder (beside an SQLite
#: database).
DEFAULT_CONTROL_SOCKET = "mcplhost.sock"


class ControlConfig(Base, frozen=True):
    """`[control]`: the Unix socket `mcplhost status` and `restart-connector` talk to (mode 0600, never TCP)."""

    socket: NonEmpty = DEFAULT_CONTROL_SOCKET  # relative to the state folder (`state_path`)


class MetricsConfig(Base, frozen=True):
    """`[metrics]`: Prometheus text format at /metrics, off unless `listen` is set (host:port; loopback by default)."""

    listen: NonEmpty | None = None


#: What `[console] actions` may enable (docs/operations.md#console); none is on by default.
ConsoleAction = Literal["restart-connector"]
CONSOLE_ACTIONS: tuple[ConsoleAction, ...] = get_args(ConsoleAction)


class ConsoleConfig(Base, frozen=True):
    """`[console]`: the web console (docs/operations.md#console), off unless `listen` is set (HOST:PORT).

    A `listen` that is not a loopback address needs `token_file` (mode 0600 or
    stricter), whose token every visitor signs in with.
    """

    listen: NonEmpty | None = None
    token_file: NonEmpty | None = None  # relative to the config's folder
    actions: list[ConsoleAction] = []


#: Per-connector quotas' defaults (docs/operations.md#quotas): the bytes quota bounds the bodies stored; the items
#: quota bounds what it does not count, each row's metadata and index entries (about 1 KB an item), to the same
#: order (about 1 GB an hour), which is also ~280 items a second all hour: far above a busy connector's rate.
DEFAULT_MAX_ITEMS_PER_HOUR = 1_000_000


DEFAULT_MAX_BYTES_PER_HOUR = 1 << 30  # stored body bytes (1 GiB)


#: How long a `ping` may go unanswered before the connector counts as deaf (and is restarted).
DEFAULT_PING_TIMEOUT_S = 10.0


class RestartConfig(Base, frozen=True):
    policy: Literal["always", "on-failure", "never"] = "on-failure"
    backoff_initial_s: Seconds = 0.5
    backoff_max_s: Seconds = 30.0
    burst: Annotated[int, Meta(ge=1)] = 5
    window_s: Seconds = 60.0


class FeatureSetSelection(Base, frozen=True):
    enabled: list[NonEmpty] | None = None  # None: selection not restricted
    disabled: list[NonEmpty] = []


#: A variable name in `env_pass`: the rule env files follow too.
EnvName = Annotated[str, Meta(pattern=f"^{ENV_NAME.pattern}$")]


class ConnectorConfig(Base, frozen=True):
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
    #: The agent this connector's bot identity speaks for: its addressed items address that agent only
    #: (docs/agents.md#addressing). None: addressed by name when several agents wake on `addressed` here.
    agent: NonEmpty | None = None
    #: Derived when the file is loaded, never written in it: every `api_key_env` of the config, which no
    #: connector's environment may hold (`DERIVED_FIELDS`).
    withheld_env: frozenset[str] = frozenset()


#: Fields filled in by `resolve`, not read from TOML: a file that sets one has an unknown key.
DERIVED_FIELDS = frozenset({"withheld_env", "state_dir"})


class ScriptToolCall(Base, frozen=True):
    """A tool call a scripted reply makes: the tool's name and its arguments object."""

    name: NonEmpty
    arguments: dict[str, Any] = {}


class ScriptReply(Base, frozen=True):
    """A scripted reply written as a TOML table: prose and the tool calls after it (docs/agents.md#backends)."""

    text: str = ""
    tool_calls: list[ScriptToolCall] = []


class BackendConfig(Base, frozen=True):
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


#: What wakes an agent unless its `wake_on` says otherwise (docs/agents.md#wakes).
DEFAULT_WAKE_ON = ("addressed", "dm")

#: docs/agents.md#bounds: a backend answer's text is cut at `max_output_chars`; `max_tool_calls_per_round` of its
#: tool calls run, the rest get a "not run" result.
DEFAULT_MAX_OUTPUT_CHARS = 100_000
DEFAULT_MAX_TOOL_CALLS_PER_ROUND = 16


class AgentConfig(Base, frozen=True):
    """One `[[agents]]` table; docs/agents.md is the rule for every key."""

    name: NonEmpty
    parent: NonEmpty | None = None
    title: str | None = None
    hears: list[NonEmpty] | None = None  # connectors or connector/channel-globs; None: every connector
    wake_on: list[NonEmpty] = msgspec.field(default_factory=lambda: list(DEFAULT_WAKE_ON))
    wake_from: list[NonEmpty] | None = None  # connector/author-id globs; None: anyone
    wake_from_bots: bool = False
    max_wakes_per_sender_per_hour: Annotated[int, Meta(ge=1)] = 30
    context_scope: Literal["agent", "conversation"] = "agent"
    tools: list[NonEmpty] | None = None  # globs over tool names; None: all
    tool_timeout_s: Seconds = 60.0
    tool_result_max_chars: Annotated[int, Meta(ge=1)] = 20_000
    max_tokens_per_day: Annotated[int, Meta(ge=0)] = 0  # 0: no limit
    publish_max_age_s: Seconds = 3600.0
    #: docs/agents.md#bounds: segments one turn may publish; the same text to one destination once per turn.
    max_publishes_per_turn: Annotated[int, Meta(ge=1)] = 20
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
    max_output_chars: Annotated[int, Meta(ge=1)] = DEFAULT_MAX_OUTPUT_CHARS
    max_tool_calls_per_round: Annotated[int, Meta(ge=1)] = DEFAULT_MAX_TOOL_CALLS_PER_ROUND
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


class InferenceConfig(Base, frozen=True):
    """`[inference]`: the backend serving connectors' inference/request and model/info (docs/agents.md#inference)."""

    backend: BackendConfig
    context_window: Annotated[int, Meta(ge=1)] = 128_000


class ModerationConfig(Base, frozen=True):
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


class Config(Base, frozen=True):
    store: StoreConfig = StoreConfig()
    host: HostConfig = HostConfig()
    connectors: list[ConnectorConfig] = []
    agents: list[AgentConfig] = []
    inference: InferenceConfig | None = None
    control: ControlConfig = ControlConfig()
    metrics: MetricsConfig = MetricsConfig()
    console: ConsoleConfig = ConsoleConfig()
    moderation: ModerationConfig | None = None


def state_path(store: StoreConfig) -> Path:
    """The folder of the daemon's own files (lock, children file, control socket): `StoreConfig.state_dir`."""
    if store.url is None or not store.state_dir:
        return Path(store.path).parent
    return Path(store.state_dir)


def control_socket_path(config: Config) -> Path:
    """Where the control socket is: `[control] socket`, relative to the state folder (after `resolve`)."""
    return state_path(config.store) / config.control.socket
