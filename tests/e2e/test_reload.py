"""SIGHUP reloads the config of a running `mcplhost run` (docs/operations.md#reload).

An added connector starts, a removed one stops, an unchanged one keeps its pid, a changed one gets a new
process and keeps its counts, and an invalid file changes nothing (each problem logged); an edited prompt
file is a changed agent; what a reload cannot change is said; SIGTERM never waits for a reload.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import msgspec

from mcplhost.config import Config, HostConfig, ModerationConfig
from mcplhost.reload import NOT_RELOADED, reload_plan

from ..agents.llm_server import LlmServer, Reply
from ..cli.support import Daemon, cli, daemon, scripted_connector, toml_table, write_config
from ..control.test_daemon import DELIVERED, GRANT
from ..harness import CHAT_MANIFEST, alive, wait_for
from ..metrics.test_metrics import sample, scrape
from .test_agents import REGISTER, said, turns


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


def answering_chat(tmp_path: Path, message_id: str, **fields: Any) -> dict[str, Any]:
    """The [[connectors]] table of disc: it registers #room, sends one addressed message and delivers publishes.

    Its script file is rewritten each time; a life reads it as it starts.
    """
    script = {"manifest": CHAT_MANIFEST, "steps": [REGISTER, said(message_id, "scout, hello", ["chat:addressed"])],
              "handlers": {"channels/publish": DELIVERED}}
    return scripted_connector("disc", script, tmp_path, grant=GRANT, **fields)


def host_config(tmp_path: Path, connector: dict[str, Any], backend: dict[str, Any], **agent: Any) -> Path:
    """disc, /metrics on a free port, and scout with `backend` and its prompt in scout.md."""
    path = write_config(tmp_path, [connector])
    path.write_text(path.read_text() + '\n[metrics]\nlisten = "127.0.0.1:0"\n\n'
                    + toml_table("[[agents]]", {"name": "scout", "wake_on": ["addressed"], "debounce_ms": 20,
                                                "system_prompt_file": "scout.md", **agent})
                    + toml_table("[agents.backend]", backend))
    return path


def openai(llm: LlmServer, **fields: Any) -> dict[str, Any]:
    return {"kind": "openai", "model": "m", "base_url": llm.openai_base_url, "api_key_env": "TEST_LLM_KEY",
            "max_retries": 0, **fields}


async def metrics(run: Daemon) -> dict:
    return await scrape((await run.wait_event("metrics.listening"))["address"])


class TestWhatAReloadKeeps:
    async def test_an_edited_prompt_file_and_a_restarted_connectors_counts_and_a_bad_reload_changes_nothing(
            self, tmp_path: Path):
        """SIGHUP after an edit of scout.md: the next turn's system prompt is the new text. disc, restarted by the
        same reload, keeps its publish count and lastPublishAt and counts one restart. Then a reload with an
        unusable base_url is refused: disc keeps its process, and the daemon serves on and stops cleanly."""
        (tmp_path / "scout.md").write_text("You are Scout, version one.")
        with LlmServer(default=Reply(text="hi")) as llm:
            config = host_config(tmp_path, answering_chat(tmp_path, "m-1"), openai(llm))
            async with daemon(config, tmp_path, env={"TEST_LLM_KEY": "k"}) as run:
                await run.wait_event("outbox.delivered")
                (before,) = status(config).values()
                (tmp_path / "scout.md").write_text("You are Scout, version two.")
                host_config(tmp_path, answering_chat(tmp_path, "m-2", request_timeout_s=6), openai(llm))
                run.signal(signal.SIGHUP)
                reloaded = await run.wait_event("host.reloaded")
                await wait_for(lambda: len(run.events("outbox.delivered")) == 2, timeout=30)
                (after,) = status(config).values()
                samples = await metrics(run)

                valid = tmp_path / "valid.toml"  # status finds the socket through a config: keep one that reads
                valid.write_text(config.read_text())
                host_config(tmp_path, answering_chat(tmp_path, "m-3", request_timeout_s=7),
                            openai(llm, base_url="::::"))
                run.signal(signal.SIGHUP)
                refused = await run.wait_event("host.reload_refused")
                assert status(valid)["disc"]["pid"] == after["pid"]  # the changed connector was not restarted
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
            first, second = (request.body["messages"][0] for request in llm.requests)
        assert reloaded["changed"] == ["disc"] and reloaded["agents_changed"] == ["scout"]
        assert first["role"] == second["role"] == "system"
        assert first["content"].startswith("You are Scout, version one.")
        assert second["content"].startswith("You are Scout, version two.") and "version one" not in second["content"]
        assert after["pid"] != before["pid"] and after["restarts"] == before["restarts"] + 1 == 1
        assert after["lastPublishAt"] >= before["lastPublishAt"] is not None
        assert sample(samples, "mcplhost_publish_total", connector="disc", outcome="delivered") == 2
        assert sample(samples, "mcplhost_connector_restarts_total", connector="disc") == 1
        assert refused["problems"] == ["agents[0].backend.base_url: '::::' is not an absolute http:// or https:// "
                                       "URL with a host (e.g. http://127.0.0.1:8000/v1)"]
        assert [t["outcome"] for t in turns(tmp_path / "host.db")] == ["completed", "completed"]


#: How long `mcplhost run` may take from SIGTERM to its exit here: its stop ladder with this test's 1 s connector
#: graces (docs/operations.md#signals-and-stopping), far below the model's 600 s timeout a reload used to wait out.
STOP_WITHIN_S = 15.0


class TestStopDuringReload:
    async def test_sigterm_stops_at_once_while_a_reload_waits_for_a_hung_turn(self, tmp_path: Path):
        """scout's model never answers; a SIGHUP that changes scout waits for its turn; SIGTERM cancels that
        reload, aborts the turn and exits 0 within the stop budget."""
        (tmp_path / "scout.md").write_text("You are Scout.")
        with LlmServer(default=Reply(hang=True)) as llm:
            config = host_config(tmp_path, answering_chat(tmp_path, "m-1"), openai(llm, timeout_s=600))
            async with daemon(config, tmp_path, env={"TEST_LLM_KEY": "k"}) as run:
                await wait_for(lambda: llm.requests, timeout=30)  # the turn is in the model call, which hangs
                host_config(tmp_path, answering_chat(tmp_path, "m-1"), openai(llm, timeout_s=600), debounce_ms=50)
                run.signal(signal.SIGHUP)
                await run.wait_event("agent.reload_waits", agent="scout")
                asked = time.monotonic()
                run.signal(signal.SIGTERM)
                assert await run.wait(timeout=STOP_WITHIN_S) == 0
                took = time.monotonic() - asked
                assert run.events("host.reload_cancelled") and not run.events("host.reloaded")
        assert took < STOP_WITHIN_S
        assert [t["outcome"] for t in turns(tmp_path / "host.db")] == ["aborted"]


class TestPlan:
    def test_what_a_reload_cannot_change_is_said_and_left(self) -> None:
        """A new store path is no connector change: the plan is empty and says the store stays."""
        running = Config()
        new = msgspec.structs.replace(running, store=msgspec.structs.replace(running.store, path="/elsewhere.db"))
        plan = reload_plan(running, new)
        assert plan.empty and plan.notes == (NOT_RELOADED["store"],)

    def test_a_changed_host_name_is_said_and_left(self) -> None:
        """`[host] name` is the host's in the shared store and its lock file's: a restart changes it."""
        new = Config(host=HostConfig(name="eu-2"))
        assert reload_plan(Config(host=HostConfig(name="eu-1")), new).notes == (NOT_RELOADED["host"],)

    def test_a_changed_moderation_table_is_said_and_left(self) -> None:
        """[moderation]'s checker is built at start: a reload says a restart applies it (docs/operations.md)."""
        new = Config(moderation=ModerationConfig(kind="command", command=["/bin/true"]))
        assert reload_plan(Config(), new).notes == (NOT_RELOADED["moderation"],)
