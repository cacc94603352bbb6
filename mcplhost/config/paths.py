"""Where a host keeps its own files, and what it is called: the state folder and `[host] name`'s default.

An SQLite store's daemon keeps its lock, its children file and its control
socket beside the database, as it always has; a PostgreSQL store has no
database folder, so they go to a state folder (docs/operations.md#the-state-folder).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from ..lock import LOCK_SUFFIX, ONE_PER_DATABASE, ONE_PER_HOST_NAME, lock_path
from .schema import MAX_HOST_NAME_CHARS, Config, StoreConfig, state_path
from .values import redact_url

#: The variable naming the state folder of a host on a PostgreSQL store (docs/operations.md#the-state-folder).
STATE_DIR_VARIABLE = "MCPLHOST_STATE_DIR"


def state_folder(store: StoreConfig, base: Path, environ: Mapping[str, str] = os.environ) -> Path:
    """The folder of the daemon's own files (its lock, children file and default control socket).

    SQLite: the database's folder. PostgreSQL has no database folder: $MCPLHOST_STATE_DIR when set (relative
    to `base`, the config's folder), else the config's folder itself.
    """
    if store.url is None:
        return (base / store.path).parent
    return base / environ[STATE_DIR_VARIABLE] if environ.get(STATE_DIR_VARIABLE) else base


#: What stands in for a hostname that names nothing (an empty one).
FALLBACK_HOST_NAME = "localhost"


def default_host_name() -> str:
    """`[host] name` when not set: the machine's hostname, cut to HOST_NAME_PATTERN's 64 characters of
    letters, digits, `.`, `_` and `-` (anything else becomes `-`)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:MAX_HOST_NAME_CHARS]
    return name or FALLBACK_HOST_NAME


class DaemonLock(NamedTuple):
    """What `run` locks (mcplhost/lock.py): what a refusal names, the lock file, and why one daemon only."""

    subject: str
    path: Path
    explanation: str


def daemon_lock(config: Config) -> DaemonLock:
    """One daemon per SQLite database (its lock beside it); on PostgreSQL, one per host name in the state
    folder: ``<name>.lock`` there, the children file beside it (mcplhost/supervisor/children.py)."""
    store = config.store
    if store.url is None:
        return DaemonLock(store.path, lock_path(Path(store.path)), ONE_PER_DATABASE)
    name = config.host.name or default_host_name()
    return DaemonLock(f"host {name} on {redact_url(store.url)}", state_path(store) / f"{name}{LOCK_SUFFIX}",
                      ONE_PER_HOST_NAME)
