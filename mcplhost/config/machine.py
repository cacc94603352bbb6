"""The machine the config names: folders, files and commands as this process's user finds them.

What check-config can see would fail at start (the database's folder, the
control socket, a prompt or token file, a connector's cwd, command or env
file) is a problem now, not a failure later.
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..envfile import EnvFileError, read_env_file, read_token_file
from ..lock import lock_path
from ..store.files import database_files
from .check import entries
from .environment import api_key_variables
from .schema import DEFAULT_CONTROL_SOCKET, StoreConfig


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
        database = base / db
        fatal += [f"store.path: {why}" for why in database_path_problems(database)]
        fatal += [f"control.socket: {why}" for why in socket_path_problems(raw.get("control"), database.parent)]
    api_keys = api_key_variables(raw)
    starts: list[str] = []
    for i, connector in entries(raw, "connectors"):
        starts += [f"connectors[{i}].{why}" for why in connector_start_problems(connector, base, api_keys)]
    for i, agent in entries(raw, "agents"):
        prompt = agent.get("system_prompt_file")
        if isinstance(prompt, str) and prompt:
            try:
                (base / prompt).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                fatal.append(f"agents[{i}].system_prompt_file: cannot read {base / prompt}: "
                             f"{exc.strerror if isinstance(exc, OSError) else exc}")
    console = raw.get("console")
    if isinstance(console, dict) and isinstance(console.get("listen"), str) and console["listen"]:
        token_file = console.get("token_file")
        if isinstance(token_file, str) and token_file:
            try:
                read_token_file(base / token_file)  # the host reads it again at start: the same refusals
            except EnvFileError as exc:
                fatal.append(f"console.token_file: {exc}")
    moderation = raw.get("moderation")
    command = moderation.get("command") if isinstance(moderation, dict) else None
    if isinstance(command, list) and command and isinstance(command[0], str) and command[0]:
        # Fatal: with its check missing, every segment would become a draft (fail-closed, docs/agents.md#moderation).
        why = command_problem(command[0], base, os.environ.get("PATH", os.defpath))
        if why:
            fatal.append(f"moderation.command: {why}")
    return fatal, starts


def socket_path_problems(control: Any, state: Path) -> list[str]:
    """Why the control socket could not be made at `[control] socket` (relative to the database's folder,
    `state`), read defensively: its folder must let this user create it, and nothing but a socket may be there.
    The database's own folder is the database check's to report."""
    socket = control.get("socket", DEFAULT_CONTROL_SOCKET) if isinstance(control, dict) else DEFAULT_CONTROL_SOCKET
    if not isinstance(socket, str) or not socket:
        return []
    path = Path(os.path.normpath(state / socket))
    if path.parent != Path(os.path.normpath(state)) and (why := folder_problems(path.parent)):
        return why
    if path.exists() and not path.is_socket():
        return [f"{path} exists and is not a socket (move it away, or set [control] socket to another path)"]
    return []


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
