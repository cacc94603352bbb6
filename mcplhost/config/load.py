"""Loading: read the TOML file, check it in one pass, decode it and resolve its paths against its folder.

Relative paths are resolved against the config file's folder, so the host
finds the same files whatever its working folder.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path

import msgspec

from ..errors import ConfigError
from .check import check
from .environment import api_key_variables, environment_warnings
from .machine import machine_problems
from .paths import default_host_name, state_folder
from .rules import config_warnings, cross_field_problems
from .schema import Config
from .values import UnknownGrant, url_passwords


def default_config_path() -> Path:
    return Path(os.environ.get("MCPLHOST_CONFIG") or "mcplhost.toml")


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
    checked = check(raw)
    fatal, per_connector = machine_problems(checked, base)
    found = (checked.problems + cross_field_problems(checked, unknown_grant) + fatal
             + (per_connector if start_problems else []))
    if found:
        raise ConfigError(f"{path}: {len(found)} problem(s)", problems=found)
    decoded = msgspec.convert(raw, Config)  # no problem found: msgspec decodes it, as the one authority
    config = resolve(decoded, base, withheld=frozenset(api_key_variables(decoded)))
    return config, config_warnings(decoded) + environment_warnings(config) + exposed_password_warnings(config, path)


#: Who besides the owner may read a config file holding a password: its group and everyone else.
SHARED_BITS = stat.S_IRWXG | stat.S_IRWXO


def exposed_password_warnings(config: Config, path: Path) -> list[str]:
    """A password written in `[store] url` of a config file others may read (never the password itself)."""
    if config.store.url is None or not url_passwords(config.store.url):
        return []
    try:
        mode = path.stat().st_mode
    except OSError:
        return []
    if not mode & SHARED_BITS:
        return []
    return [f"store.url: holds a password, and {path} may be read by others (mode {stat.S_IMODE(mode):04o}): "
            "chmod 600 it, or give the password by PGPASSWORD or a PGPASSFILE instead"]


class ConfigMissing(ConfigError):
    """The config file does not exist (the caller knows whether a hint about --config helps)."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path}: no such file")
        self.path = path


def resolve(config: Config, base: Path, *, withheld: frozenset[str] = frozenset()) -> Config:
    """Make every path absolute, relative to `base`, and give each connector the variables it never gets.

    Paths: `store.path` (and the state folder, `state_folder`), every `cwd` and `env_file`, every
    `system_prompt_file`, a `[moderation] command` path, `[console] token_file`.
    `withheld`: the host's api key variables (`api_key_variables`). `[host] name` defaults to the hostname.
    """
    store = msgspec.structs.replace(config.store, path=str(base / config.store.path),
                                    state_dir=str(state_folder(config.store, base)))
    host = msgspec.structs.replace(config.host, name=config.host.name or default_host_name())
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
    console = config.console
    if console.token_file is not None:
        console = msgspec.structs.replace(console, token_file=str(base / console.token_file))
    return msgspec.structs.replace(config, store=store, host=host, connectors=connectors, agents=agents,
                                   moderation=moderation, console=console)

