"""SIGHUP reloads the config of a running `mcplhost run` (docs/operations.md#reload).

An added connector starts, a removed one stops, an unchanged one keeps its pid, a changed one gets a new
process, and an invalid file changes nothing (each problem logged); what a reload cannot change is said.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import msgspec

from mcplhost.config import Config, ModerationConfig
from mcplhost.reload import NOT_RELOADED, reload_plan

from ..cli.support import cli, daemon, scripted_connector, write_config
from ..harness import CHAT_MANIFEST, alive, wait_for


def status(config: Path) -> dict[str, dict[str, Any]]:
    result = cli("status", "--config", str(config), "--json")
    if result.returncode != 0:
        return {}
    return {c["name"]: c for c in json.loads(result.stdout)["connectors"]}


def connector(name: str, tmp_path: Path, **fields: Any) -> dict[str, Any]:
    return scripted_connector(name, {"manifest": CHAT_MANIFEST}, tmp_path, **fields)


def ready(config: Path, *names: str) -> bool:
    shown = status(config)
    return all(shown.get(name, {}).get("state") == "ready" and shown[name].get("pid") for name in names)


class TestReload:
    async def test_added_removed_changed_and_unchanged_connectors_and_an_invalid_file(self, tmp_path: Path):
        config = write_config(tmp_path, [connector("keep", tmp_path), connector("drop", tmp_path),
                                         connector("edit", tmp_path)])
        async with daemon(config, tmp_path) as run:
            await wait_for(lambda: ready(config, "keep", "drop", "edit"), timeout=30)
            before = status(config)
            write_config(tmp_path, [connector("keep", tmp_path), connector("edit", tmp_path, request_timeout_s=7),
                                    connector("new", tmp_path)])
            run.signal(signal.SIGHUP)
            await wait_for(lambda: ready(config, "keep", "edit", "new") and "drop" not in status(config), timeout=30)
            after = status(config)
            assert after["keep"]["pid"] == before["keep"]["pid"]  # unchanged: the same process
            assert after["edit"]["pid"] != before["edit"]["pid"]  # its table changed: started again
            await wait_for(lambda: not alive(before["drop"]["pid"]))  # removed: stopped
            valid = tmp_path / "valid.toml"  # status finds the socket through a config: keep one that reads
            valid.write_text(config.read_text())
            config.write_text(config.read_text() + "\n[[connectors]]\nname = \"broken\"\n")  # no command
            run.signal(signal.SIGHUP)
            await wait_for(lambda: "host.reload_refused" in run.stderr(), timeout=30)
            assert {name: c["pid"] for name, c in status(valid).items()} == {n: c["pid"] for n, c in after.items()}
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        assert "connectors[3].command" in run.stderr()  # the problem itself is logged


class TestPlan:
    def test_what_a_reload_cannot_change_is_said_and_left(self) -> None:
        """A new store path is no connector change: the plan is empty and says the store stays."""
        running = Config()
        new = msgspec.structs.replace(running, store=msgspec.structs.replace(running.store, path="/elsewhere.db"))
        plan = reload_plan(running, new)
        assert plan.empty and plan.notes == (NOT_RELOADED["store"],)

    def test_a_changed_moderation_table_is_said_and_left(self) -> None:
        """[moderation]'s checker is built at start: a reload says a restart applies it (docs/operations.md)."""
        new = Config(moderation=ModerationConfig(kind="command", command=["/bin/true"]))
        assert reload_plan(Config(), new).notes == (NOT_RELOADED["moderation"],)
