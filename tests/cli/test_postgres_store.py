"""The commands on a real PostgreSQL store (tests/postgres.py): `--db URL` reads and migrates, the status shows the
URL and the database's size, and each bad input is one plain line, a non-zero exit and nothing written
(docs/operations.md#a-postgresql-store)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import anyio
import asyncpg
import pytest

from mcplhost.agents.wiring import build_agents
from mcplhost.config import Config
from mcplhost.control.responder import ControlService
from mcplhost.store import open_store
from mcplhost.store.writer import GroupWriter

from ..builders import incoming, message, register
from ..harness import record
from ..postgres import PostgresDatabase
from ..speech.test_outbox import DELIVERED
from .pg_refusing import refusing_server
from .support import cli, cli_process, daemon, scripted_connector, toml_table

SECRET = "hunter2-pg-password"


def one_line(stderr: str) -> str:
    (line,) = stderr.splitlines()
    assert line.startswith("mcplhost") and "Traceback" not in line and SECRET not in line, line
    return line


async def tables(url: str) -> list[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT table_name FROM information_schema.tables WHERE table_schema = "
                                "current_schema() ORDER BY table_name")
        return [row["table_name"] for row in rows]
    finally:
        await conn.close()


async def execute(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


class TestCommands:
    def test_migrate_then_read_an_empty_store(self, postgres_db: PostgresDatabase) -> None:
        migrated = cli("migrate", "--db", postgres_db.url)
        assert migrated.returncode == 0, migrated.stderr
        assert migrated.stdout.startswith("applied ") and "migration(s)" in migrated.stdout
        for command in (["messages", "--json"], ["turns", "--json"], ["outbox", "--json"]):
            result = cli(*command, "--db", postgres_db.url)
            assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), (command, result.stderr)

    def test_a_database_of_another_program_is_refused_and_left_as_it_was(self, postgres_db: PostgresDatabase) -> None:
        anyio.run(execute, postgres_db.url, "CREATE TABLE items (id integer PRIMARY KEY, body text)")
        for command in (["migrate"], ["messages"]):
            result = cli(*command, "--db", postgres_db.url)
            assert result.returncode == 1 and result.stdout == ""
            one_line(result.stderr)
        assert anyio.run(tables, postgres_db.url) == ["items"]

    def test_a_schema_newer_than_the_code_is_refused(self, postgres_db: PostgresDatabase) -> None:
        assert cli("migrate", "--db", postgres_db.url).returncode == 0
        anyio.run(execute, postgres_db.url, "INSERT INTO schema_version (version, name, applied_at) "
                                            "VALUES (9999, 'future', 0)")
        for command in (["migrate"], ["messages"]):
            result = cli(*command, "--db", postgres_db.url)
            assert result.returncode == 1
            assert "9999" in one_line(result.stderr)


class TestBadServer:
    def test_a_wrong_password_is_one_line_without_the_password(self, tmp_path: Path) -> None:
        """Every command that takes --db, and run: one line naming the server, nothing created."""
        with refusing_server() as port:
            url = f"postgresql://mcplhost:{SECRET}@127.0.0.1:{port}/mcplhost"
            config = tmp_path / "mcplhost.toml"
            config.write_text(f'[store]\nurl = "{url}"\n[host]\nname = "eu-1"\n')
            config.chmod(0o600)
            for command in (["messages"], ["turns"], ["outbox"], ["search", "x"], ["migrate"],
                            ["explain", "1", "--config", str(config)]):
                result = cli(*command, "--db", url, cwd=tmp_path)
                assert result.returncode == 1 and result.stdout == ""
                assert f"127.0.0.1:{port} refused the password" in one_line(result.stderr), command
            assert sorted(p.name for p in tmp_path.iterdir()) == ["mcplhost.toml"]
            result = cli_process("run", "--config", str(config), cwd=tmp_path)
            assert result.returncode == 1
            assert f"127.0.0.1:{port} refused the password" in one_line(result.stderr)


class TestStatus:
    async def test_the_db_field_is_the_url_without_its_password_and_the_size_the_database_s(
            self, postgres_db: PostgresDatabase) -> None:
        url = postgres_db.url.replace("postgres@", f"postgres:{SECRET}@")  # trust: any password is accepted
        async with open_store(url) as store:
            writer = GroupWriter(store)
            service = ControlService(store, {}, build_agents(Config(), store, writer, {}), started_at_ms=1,
                                     host_name="eu-1")
            status = await service.status()
            writer.close()
        assert status.host.db == url.replace(SECRET, "***") and status.host.db_bytes > 0
        assert [(h.name, h.heartbeat_age_ms) for h in status.hosts] == [("eu-1", 0)]


class TestRun:
    async def test_a_host_on_postgresql_keeps_its_files_in_the_state_folder_and_reports_the_url(
            self, postgres_db: PostgresDatabase, tmp_path: Path) -> None:
        """`run` with [store] url: the lock, the children file and the socket in $MCPLHOST_STATE_DIR; status
        shows the URL (password as ***), the database's size and this host alone in `hosts`; SIGTERM exits 0."""
        state, folder = tmp_path / "state", tmp_path / "config"
        state.mkdir()
        folder.mkdir()
        url = postgres_db.url.replace("postgres@", f"postgres:{SECRET}@")
        config = folder / "mcplhost.toml"
        config.write_text(f'[store]\nurl = "{url}"\npool_size = 4\n[host]\nname = "eu-1"\n')
        env = {"MCPLHOST_STATE_DIR": str(state)}
        async with daemon(config, tmp_path, env=env) as run:
            await run.wait_event("host.ready")
            assert sorted(p.name for p in state.iterdir()) == ["eu-1.children", "eu-1.lock", "mcplhost.sock"]
            result = cli("status", "--json", "--config", str(config), env=env)
            assert result.returncode == 0, result.stderr
            whole = json.loads(result.stdout)
            assert whole["host"]["db"] == url.replace(SECRET, "***") and whole["host"]["dbBytes"] > 0
            assert [(h["name"], h["pid"]) for h in whole["hosts"]] == [("eu-1", run.pid)]
            assert SECRET not in run.stderr()
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        assert sorted(p.name for p in folder.iterdir()) == ["mcplhost.toml"]  # nothing beside the config

    async def test_kill_9_of_a_connectors_owner_lets_the_standby_host_run_it_within_10_s(
            self, postgres_db: PostgresDatabase, tmp_path: Path) -> None:
        """Two `run`s configured for one connector: the second shows it as standby with the first as its owner;
        kill -9 of the first ends its database session, and with it the lock: the second runs the connector."""
        runs = {}
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            connector = toml_table("[[connectors]]", scripted_connector("chat", {}, tmp_path / name))
            (tmp_path / name / "mcplhost.toml").write_text(
                f'[store]\nurl = "{postgres_db.url}"\npool_size = 2\n[host]\nname = "{name}"\n\n{connector}')
            runs[name] = tmp_path / name / "mcplhost.toml"
        async with daemon(runs["a"], tmp_path) as a:
            await a.wait_event("hosts.connector_owned", host="a", connector="chat")
            async with daemon(runs["b"], tmp_path) as b:
                await b.wait_event("host.ready")
                status = json.loads(cli("status", "--json", "--config", str(runs["b"])).stdout)
                assert [(c["state"], c["pid"], c["owner"]) for c in status["connectors"]] == [("standby", None, "a")]
                assert [(h["name"], h["pid"], h["connectors"]) for h in status["hosts"]] == [
                    ("a", a.pid, ["chat"]), ("b", b.pid, [])]
                a.signal(signal.SIGKILL)
                await b.wait_event("hosts.connector_owned", timeout=10, host="b", connector="chat")
                await b.wait_event("connector.mcp_only", timeout=10)
                status = json.loads(cli("status", "--json", "--config", str(runs["b"])).stdout)
                assert [(c["state"], c["pid"] is not None, "owner" in c) for c in status["connectors"]] == [
                    ("mcp_only", True, False)]
                # A said no goodbye, but its session ended with it: it is no longer listed
                assert [(h["name"], h["connectors"]) for h in status["hosts"]] == [("b", ["chat"])]

    async def test_a_mention_through_one_hosts_connector_is_answered_by_an_agent_the_other_runs_through_it(
            self, postgres_db: PostgresDatabase, tmp_path: Path) -> None:
        """Two `run`s with different parts: A runs connector `chat`, B runs agent `scout`. A message through A's
        connector wakes scout on B (a notification), and scout's reply is sent by A, through `chat`."""
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
        manifest = {"version": "0.5", "channels": {"register": True, "incoming": True, "publish": True},
                    "featureSets": {"chat": {"description": "chat",
                                             "uses": ["channels.register", "channels.incoming", "channels.publish"]}}}
        script = {"manifest": manifest, "handlers": {"channels/publish": DELIVERED},
                  "steps": [register("room"), incoming(message("room", body="@scout anyone there?"))]}
        connector = toml_table("[[connectors]]", scripted_connector(
            "chat", script, tmp_path / "a", grant=["channels.register", "channels.incoming", "channels.publish"]))
        head = f'[store]\nurl = "{postgres_db.url}"\npool_size = 2\n[host]\nname = '
        (tmp_path / "a" / "mcplhost.toml").write_text(f'{head}"a"\n\n{connector}')
        (tmp_path / "b" / "mcplhost.toml").write_text(
            f'{head}"b"\n\n[[agents]]\nname = "scout"\nwake_on = ["all"]\n'
            f'[agents.backend]\nkind = "scripted"\nscript = ["hello from b"]\n')
        async with daemon(tmp_path / "b" / "mcplhost.toml", tmp_path) as b:
            await b.wait_event("host.ready")  # scout's cursor is set before A stores anything
            async with daemon(tmp_path / "a" / "mcplhost.toml", tmp_path) as a:
                await a.wait_event("outbox.delivered", timeout=30, connector="chat", agent="scout")
                (sent,) = [m for m in record(tmp_path / "a", "chat").received if m.get("method") == "channels/publish"]
                assert sent["params"]["channelId"] == "room"
                assert sent["params"]["content"] == [{"type": "text", "text": "hello from b"}]
                await b.wait_event("speech.queued", agent="scout", connector="chat")


@pytest.fixture(autouse=True)
def _no_state_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MCPLHOST_STATE_DIR", raising=False)
