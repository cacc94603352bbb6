"""The machine the config names: folders, files and commands as this process's user finds them.

What check-config can see would fail at start (the database's folder, the
control socket, a prompt or token file, a connector's cwd, command or env
file) is a problem now, not a failure later.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from ..envfile import EnvFileError, read_env_file, read_token_file
from ..lock import lock_path
from ..store.files import database_files
from .check import Checked
from .environment import api_key_variables
from .paths import STATE_DIR_VARIABLE, state_folder
from .schema import ConnectorConfig

#: The PostgreSQL driver (the optional extra `postgres`), which check-config looks for without importing it.
DRIVER = "asyncpg"


def machine_problems(checked: Checked, base: Path) -> tuple[list[str], list[str]]:
    """What the config names that is not there, checked beside the type checks (relative to `base`).

    Two lists: what stops the host (the database's folder, an agent's prompt
    file) and what stops only one connector from starting (its cwd, command
    or env file). A value of the wrong type is the type checks' to report:
    the checks that need it are skipped.
    """
    config = checked.config
    fatal: list[str] = []
    if config.store.url is not None:
        if checked.usable("store.url"):  # no database folder: the daemon's own files go to the state folder
            if importlib.util.find_spec(DRIVER) is None:
                fatal.append(f"store.url: PostgreSQL needs the driver {DRIVER}, not installed with this mcplhost: "
                             "install mcplhost[postgres]")
            state = state_folder(config.store, base)
            fatal += [f"store.url: {why} (the state folder: {STATE_DIR_VARIABLE}, else the config's folder)"
                      for why in folder_problems(state)]
            fatal += [f"control.socket: {why}" for why in socket_path_problems(config.control.socket, state)]
    elif config.store.path and checked.usable("store.path"):
        database = base / config.store.path
        fatal += [f"store.path: {why}" for why in database_path_problems(database)]
        fatal += [f"control.socket: {why}" for why in socket_path_problems(config.control.socket, database.parent)]
    api_keys = api_key_variables(config)
    starts: list[str] = []
    for i, connector in enumerate(config.connectors):
        usable = checked.usable_in(f"connectors[{i}]")
        starts += [f"connectors[{i}].{why}" for why in connector_start_problems(connector, base, api_keys,
                                                                                 usable=usable)]
    for i, agent in enumerate(config.agents):
        if agent.system_prompt_file:
            prompt = base / agent.system_prompt_file
            try:
                prompt.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                fatal.append(f"agents[{i}].system_prompt_file: cannot read {prompt}: "
                             f"{exc.strerror if isinstance(exc, OSError) else exc}")
    if config.console.listen and config.console.token_file:
        try:
            read_token_file(base / config.console.token_file)  # the host reads it again at start: the same refusals
        except EnvFileError as exc:
            fatal.append(f"console.token_file: {exc}")
    command = config.moderation.command if config.moderation is not None else None
    if command and command[0]:
        # Fatal: with its check missing, every segment would become a draft (fail-closed, docs/agents.md#moderation).
        why = command_problem(command[0], base, os.environ.get("PATH", os.defpath))
        if why:
            fatal.append(f"moderation.command: {why}")
    return fatal, starts


def socket_path_problems(socket: str, state: Path) -> list[str]:
    """Why the control socket could not be made at `[control] socket` (relative to the state folder, `state`:
    the database's): its folder must let this user create it, and nothing but a socket may be there.
    The state folder itself is the store check's to report."""
    if not socket:
        return []
    path = Path(os.path.normpath(state / socket))
    if path.parent != Path(os.path.normpath(state)) and (why := folder_problems(path.parent)):
        return why
    if path.exists() and not path.is_socket():
        return [f"{path} exists and is not a socket (move it away, or set [control] socket to another path)"]
    return []


def connector_start_problems(connector: ConnectorConfig, base: Path, api_keys: Mapping[str, str], *,
                             usable: Callable[[str], bool] = lambda field: True) -> list[str]:
    """Why one connector would not start: its env file, its cwd, its command (as ``field: why``).

    `usable(field)`: whether the connector's `field` holds the document's value (`Checked.usable`); a check
    that needs one that does not is skipped.
    """
    found: list[str] = []
    own: dict[str, str] = {}
    if connector.env_file:
        try:
            own = read_env_file(base / connector.env_file)
        except EnvFileError as exc:
            found.append(f"env_file: {exc}")
        for name in sorted(own.keys() & api_keys.keys()):
            found.append(f"env_file: {base / connector.env_file} sets {name}, which holds an api key of this host "
                         f"(named by {api_keys[name]}); connectors never get it")
    if not usable("cwd"):
        return found
    cwd = base / connector.cwd if connector.cwd is not None else base
    if not cwd.is_dir():
        return found + [f"cwd: {cwd} " + ("is not a folder" if cwd.exists() else "does not exist")]
    if connector.command and connector.command[0] and usable("env.PATH"):
        # The child's PATH decides (subprocess searches the environment it is given): `env`, then the file, then ours.
        search = connector.env.get("PATH") or own.get("PATH") or os.environ.get("PATH", os.defpath)
        why = command_problem(connector.command[0], cwd, search)
        if why:
            found.append(f"command: {why}")
    return found


def database_path_problems(path: Path) -> list[str]:
    """Why the daemon could not create or use a database at `path` (its folder is never created for it).

    As this process's user sees it: the folder must let it create files (the database, SQLite's WAL and
    shared-memory files and the lock are made there), and each of those files that exists must be readable
    and writable.
    """
    if str(path) == "":
        return ["empty path"]
    if path.is_dir():
        return [f"{path} is a directory, not a database file"]
    folder = path.parent
    if not folder.exists():
        return [f"the folder {folder} does not exist (create it; under systemd StateDirectory= does)"]
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=True):
        return [f"the folder {folder} is not writable by {current_user()}: the database, its WAL and its lock "
                "are made there (run as the user who owns it, or give that user the folder)"]
    return [f"{file} is not readable and writable by {current_user()}"
            for file in (*database_files(path), lock_path(path))
            if file.exists() and not os.access(file, os.R_OK | os.W_OK, effective_ids=True)]


def folder_problems(folder: Path) -> list[str]:
    """Why this process's user could not make a file in `folder` (a socket, say)."""
    if not folder.is_dir():
        return [f"the folder {folder} " + ("is not a folder" if folder.exists() else "does not exist")]
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=True):
        return [f"the folder {folder} is not writable by {current_user()}"]
    return []


def current_user() -> str:
    """This process's (effective) user by name, as a problem names who lacks a permission."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


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
