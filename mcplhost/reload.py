"""What a config reload (SIGHUP) changes, and the reloads themselves (docs/operations.md#reload).

    plan = reload_plan(running, new)      # pure: both resolved (absolute paths)
    plan.removed, plan.added, plan.changed, plan.notes

    reloads = Reloads(reread)             # SIGHUP's: reloads.request(); tg.start_soon(reloads.run, host, stop)

A connector is identified by its name. One whose table is unchanged keeps
its process (and pid); one whose table changed is stopped and started
again; a new name is started, a name that is gone is stopped. Agents are
updated in place by the runtime (mcplhost/agents/runtime.py `prepare_reload`,
`apply_reload`). What a reload cannot change in a running host is said in `notes` and left as it
runs: the store (`store.path`, `store.url` and the rest of `[store]`), `[host]`, `[control]`,
`[metrics]`, `[console]`, `[inference]`, `[moderation]`, and agents added to a host started without any (a restart applies those).

`Reloads` runs them one at a time beside the signal watcher, so a reload
waiting for a turn never holds up SIGTERM: the stop cancels it. Several
SIGHUPs during a reload make one more. It is the exception boundary: an
invalid file, a config that cannot be built or a bug in a reload is
logged, and the daemon goes on (with the config it had, except after a bug
halfway, which the error line says).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import anyio
import msgspec
import structlog

from mcplhost.config import Config, ConnectorConfig
from mcplhost.errors import ConfigError

log = structlog.get_logger()


class ReloadPlan(msgspec.Struct, frozen=True):
    removed: tuple[str, ...]  # connector names to stop
    added: tuple[ConnectorConfig, ...]  # connectors to start
    changed: tuple[ConnectorConfig, ...]  # connectors to stop and start again with their new table
    unchanged: tuple[str, ...]
    notes: tuple[str, ...]  # what the reload leaves as it runs, one line each

    @property
    def empty(self) -> bool:
        return not (self.removed or self.added or self.changed)


#: Parts of the config a reload does not apply, and why the operator must restart for them.
NOT_RELOADED = {
    "store": "[store] cannot change by reload (the database is open); restart the daemon to change it",
    "host": "[host] cannot change by reload (the name is this host's in the shared store and its lock file's); "
            "restart the daemon to change it",
    "control": "[control] cannot change by reload (the socket is open); restart the daemon to change it",
    "metrics": "[metrics] cannot change by reload (the listener is open); restart the daemon to change it",
    "console": "[console] cannot change by reload (the listener is open); restart the daemon to change it",
    "inference": "[inference] is not reloaded; restart the daemon to change it",
    "moderation": "[moderation] is not reloaded (its checker is built at start); restart the daemon to change it",
}
#: Agents are added, removed and updated in place, but a host started without agents runs no agents runtime.
FIRST_AGENTS = "[[agents]] added to a host started without agents are not started; restart the daemon for them"


def reload_plan(running: Config, new: Config) -> ReloadPlan:
    """The connectors to stop, start and restart, and the notes for what stays as it runs."""
    old = {spec.name: spec for spec in running.connectors}
    wanted = {spec.name: spec for spec in new.connectors}
    removed = tuple(name for name in old if name not in wanted)
    added = tuple(spec for name, spec in wanted.items() if name not in old)
    changed = tuple(spec for name, spec in wanted.items() if name in old and old[name] != spec)
    unchanged = tuple(name for name, spec in wanted.items() if name in old and old[name] == spec)
    notes = tuple(note for part, note in NOT_RELOADED.items() if getattr(running, part) != getattr(new, part))
    if not running.agents and new.agents:
        notes += (FIRST_AGENTS,)
    return ReloadPlan(removed=removed, added=added, changed=changed, unchanged=unchanged, notes=notes)


class Reloadable(Protocol):
    """What a reload applies a new config to (mcplhost/host.py `Host`)."""

    async def reload(self, new: Config) -> Any: ...


class Reloads:
    """SIGHUP's reloads: one at a time, cancelled by the stop, none able to end the daemon (module docstring)."""

    def __init__(self, reread: Callable[[], Config] | None) -> None:
        self._reread = reread  # the config file read and validated again (None: there is no file to read)
        self._wanted = anyio.Event()

    def request(self) -> None:
        """A SIGHUP: one reload runs as soon as the one in progress (if any) has ended."""
        self._wanted.set()

    async def run(self, target: Reloadable, stop: anyio.Event) -> None:
        """Apply the requested reloads to `target` until `stop` is set, which cancels the one in progress."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._serve, target)
            await stop.wait()
            tg.cancel_scope.cancel()

    async def _serve(self, target: Reloadable) -> None:
        while True:
            await self._wanted.wait()
            self._wanted = anyio.Event()
            await self.once(target)

    async def once(self, target: Reloadable) -> None:
        """Read the file again and apply it: refused (every problem logged) when invalid or not buildable."""
        if self._reread is None:
            log.warning("host.reload_unsupported", signal="SIGHUP", detail="this host has no config file to read")
            return
        try:
            await target.reload(self._reread())
        except ConfigError as exc:
            log.warning("host.reload_refused", error=exc.message, problems=exc.problems,
                        detail="the new config is not valid or cannot be built; the running config stays")
        except anyio.get_cancelled_exc_class():
            log.warning("host.reload_cancelled", detail="the daemon is stopping")
            raise
        except Exception:  # the boundary: no reload ends the daemon
            log.error("host.reload_failed", exc_info=True,
                      detail="a bug stopped this reload, perhaps halfway; the daemon goes on; restart it to be sure "
                             "it runs the file as written")
