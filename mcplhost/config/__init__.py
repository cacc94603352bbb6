"""The configuration file: TOML decoded into frozen, strict msgspec Structs (docs/architecture.md#layers).

By job: schema.py is the file's shape, load.py reads and resolves it,
check.py walks the raw document for every type problem at once (the only
module that reads it) and hands the rest a typed config, rules.py and
values.py hold the rules across and within fields, machine.py the folders,
files and commands the config names, environment.py the variables it names
(the host's api keys, connectors' secrets). The names other packages use are
re-exported here, so they import from `mcplhost.config`.
"""

from .environment import (
    api_key_places,
    connector_secret_sources,
    secret_values,
    short_secret_warnings,
    store_secret_values,
    unset_api_key,
)
from .load import ConfigMissing, default_config_path, load_config, read_config
from .machine import database_path_problems
from .paths import STATE_DIR_VARIABLE, DaemonLock, daemon_lock, default_host_name, state_folder
from .rules import MAX_TREE_DEPTH, addressed_wakers, problems, warnings
from .schema import (
    CONSOLE_ACTIONS,
    DEFAULT_DEBOUNCE_MS,
    DEFAULT_MAX_BYTES_PER_HOUR,
    DEFAULT_MAX_ITEMS_PER_HOUR,
    DEFAULT_MAX_OUTPUT_CHARS,
    DEFAULT_MAX_TOOL_CALLS_PER_ROUND,
    DEFAULT_MODERATION_MODEL,
    DERIVED_FIELDS,
    AgentConfig,
    BackendConfig,
    Config,
    ConnectorConfig,
    ConsoleConfig,
    FeatureSetSelection,
    HostConfig,
    InferenceConfig,
    MetricsConfig,
    ModerationConfig,
    RestartConfig,
    ScriptReply,
    ScriptToolCall,
    StoreConfig,
    control_socket_path,
    effective_max_wait_ms,
    state_path,
    system_prompt_text,
)
from .values import WAKE_ON_KEYWORDS, base_url_problem, is_loopback, listen_address, redact_url, store_url_problem

__all__ = [
    "STATE_DIR_VARIABLE",
    "DaemonLock",
    "HostConfig",
    "daemon_lock",
    "default_host_name",
    "redact_url",
    "state_folder",
    "state_path",
    "store_secret_values",
    "store_url_problem",
    "CONSOLE_ACTIONS",
    "DEFAULT_DEBOUNCE_MS",
    "DEFAULT_MAX_BYTES_PER_HOUR",
    "DEFAULT_MAX_ITEMS_PER_HOUR",
    "DEFAULT_MAX_OUTPUT_CHARS",
    "DEFAULT_MAX_TOOL_CALLS_PER_ROUND",
    "DEFAULT_MODERATION_MODEL",
    "DERIVED_FIELDS",
    "MAX_TREE_DEPTH",
    "WAKE_ON_KEYWORDS",
    "AgentConfig",
    "BackendConfig",
    "Config",
    "ConfigMissing",
    "ConnectorConfig",
    "ConsoleConfig",
    "FeatureSetSelection",
    "InferenceConfig",
    "MetricsConfig",
    "ModerationConfig",
    "RestartConfig",
    "ScriptReply",
    "ScriptToolCall",
    "StoreConfig",
    "addressed_wakers",
    "api_key_places",
    "base_url_problem",
    "connector_secret_sources",
    "control_socket_path",
    "database_path_problems",
    "default_config_path",
    "effective_max_wait_ms",
    "is_loopback",
    "listen_address",
    "load_config",
    "problems",
    "read_config",
    "secret_values",
    "short_secret_warnings",
    "system_prompt_text",
    "unset_api_key",
    "warnings",
]
