"""What the config names in the environment: the host's api key variables, the secret variables of connectors.

The one list of where the host keeps keys (no connector gets them), the
secret values it withholds and redacts (docs/agents.md#secrets), and the
warnings about variables unset where check-config runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..envfile import EnvFileError, read_env_file
from ..secrets import MIN_SECRET_CHARS
from .schema import AgentConfig, Config, ConnectorConfig
from .values import url_passwords

#: The name a password of `[store] url` is redacted by (`[redacted:store.url]`); there is no variable to name.
STORE_URL_SECRET = "store.url"
#: libpq's password variable, which asyncpg reads like libpq when the URL holds no password.
PG_PASSWORD_VARIABLE = "PGPASSWORD"


def api_key_places(config: Config) -> list[tuple[str, str]]:
    """Where the config names the host's own api keys, as (path of the `api_key_env`, variable name).

    Agents' backends, `[inference]`'s and `[moderation]`: the one list of
    where the host keeps keys, which connectors never get.
    """
    places = [(f"agents[{i}].backend.api_key_env", a.backend.api_key_env) for i, a in enumerate(config.agents)]
    if config.inference is not None:
        places.append(("inference.backend.api_key_env", config.inference.backend.api_key_env))
    if config.moderation is not None:
        places.append(("moderation.api_key_env", config.moderation.api_key_env))
    return [(where, name) for where, name in places if name is not None]


def api_key_variables(config: Config) -> dict[str, str]:
    """The variables holding the host's own api keys, each with the first place that names it; with `[store] url`
    also PGPASSWORD, the store's password the libpq way: no connector gets any of them."""
    found: dict[str, str] = {}
    for where, name in api_key_places(config):
        if name:  # an empty name is a type problem, and names no variable
            found.setdefault(name, where)
    if config.store.url is not None:
        found.setdefault(PG_PASSWORD_VARIABLE, "store.url")
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
    found.update(store_secret_sources(config, environ))
    for i, connector in enumerate(config.connectors):
        for name, found_at in connector_secret_sources(connector, environ, where=f"connectors[{i}]").items():
            found.setdefault(name, found_at)
    return found


def store_secret_sources(config: Config, environ: Mapping[str, str] = os.environ) -> dict[str, tuple[str, str]]:
    """The PostgreSQL store's credentials as `secret_sources` has them: the URL's password (as written and
    decoded) and, with a URL, PGPASSWORD's value. PGPASSFILE is left to the driver: a file, never read here."""
    url = config.store.url
    if url is None:
        return {}
    found = {f"{STORE_URL_SECRET}#{n}" if n else STORE_URL_SECRET: (form, "store.url")
             for n, form in enumerate(url_passwords(url))}
    if environ.get(PG_PASSWORD_VARIABLE):
        found[PG_PASSWORD_VARIABLE] = (environ[PG_PASSWORD_VARIABLE], "store.url")
    return found


def store_secret_values(config: Config, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The store's credentials alone (`store_secret_sources`), by name: redacted before the store opens."""
    return {name: value for name, (value, _where) in store_secret_sources(config, environ).items()}


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


#: Backends that call a model server with a key (the scripted one reads none).
KEYED_BACKENDS = ("openai", "anthropic")


def unset_api_key(agent: AgentConfig, environ: Mapping[str, str] = os.environ) -> str | None:
    """The variable the agent's backend takes its key from, when it is unset or empty: every call fails `missing_key`."""
    name = agent.backend.api_key_env
    return name if agent.backend.kind in KEYED_BACKENDS and name is not None and not environ.get(name) else None


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
