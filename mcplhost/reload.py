"""What a config reload (SIGHUP) changes, decided from the old and the new config alone; pure (docs/operations.md#reload).

    plan = reload_plan(running, new)      # both resolved (absolute paths)
    plan.removed, plan.added, plan.changed, plan.notes

A connector is identified by its name. One whose table is unchanged keeps
its process (and pid); one whose table changed is stopped and started
again; a new name is started, a name that is gone is stopped. Agents are
updated in place by the runtime (mcplhost/agents/runtime.py `reload`). What a
reload cannot change in a running host is said in `notes` and left as it
runs: the store (`store.path` and the rest of `[store]`), `[control]`,
`[metrics]`, `[console]`, `[inference]`, `[moderation]`, and agents added to a host started without any (a restart applies those).
"""

from __future__ import annotations

import msgspec

from mcplhost.config import Config, ConnectorConfig


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
