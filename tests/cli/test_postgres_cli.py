"""`--db URL` and `[store] url` at the command line (in-process): each bad input one plain stderr line, a non-zero
exit, the password never shown and nothing created (docs/operations.md#a-postgresql-store)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .support import cli, cli_process

SECRET = "hunter2-pg-password"
#: Nothing listens on port 1 of the loopback address: refused at once.
UNREACHABLE = f"postgresql://mcplhost:{SECRET}@127.0.0.1:1/mcplhost"


def one_line(stderr: str) -> str:
    """The one stderr line a bad input gives: no traceback, never the password."""
    (line,) = stderr.splitlines()
    assert line.startswith("mcplhost") and "Traceback" not in line and SECRET not in line, line
    return line


class TestDb:
    def test_backup_of_a_postgresql_store_says_pg_dump(self, tmp_path: Path) -> None:
        out = tmp_path / "copy.db"
        result = cli("backup", "--db", UNREACHABLE, str(out))
        assert result.returncode == 2 and result.stdout == ""
        line = one_line(result.stderr)
        assert "pg_dump" in line and "postgresql://mcplhost:***@127.0.0.1:1/mcplhost" in line
        assert not out.exists()

    @pytest.mark.parametrize("command", [["messages"], ["migrate"], ["backup", "--", "out"]])
    def test_a_url_the_driver_cannot_parse_is_a_usage_error(self, tmp_path: Path, command: list[str]) -> None:
        """An unclosed [ made the driver's URL parser raise past the store: now --db refuses it, password unshown."""
        name, *rest = command
        result = cli(name, "--db", f"postgresql://mcplhost:{SECRET}@[::1/mcplhost", *rest, cwd=tmp_path)
        assert result.returncode == 2
        assert "is not a URL (Invalid IPv6 URL)" in one_line(result.stderr)
        assert list(tmp_path.iterdir()) == []

    def test_dev_runs_on_sqlite_only(self, tmp_path: Path) -> None:
        result = cli("dev", "--db", UNREACHABLE, "--seconds", "1", cwd=tmp_path)
        assert result.returncode == 2
        assert "dev runs on an SQLite file only" in one_line(result.stderr)
        assert list(tmp_path.iterdir()) == []

    def test_explain_on_a_url_needs_its_config(self, tmp_path: Path) -> None:
        (tmp_path / "mcplhost.toml").write_text("")  # a config in the working folder is not taken for the store's
        result = cli("explain", "--db", UNREACHABLE, "1", cwd=tmp_path)
        assert result.returncode == 2
        assert "pass --config PATH" in one_line(result.stderr)


class TestRun:
    def test_run_on_an_unreachable_server_gives_up_with_one_line(self, tmp_path: Path) -> None:
        """The host starts (a process of its own), tries the server until the store's deadline (it may be starting
        beside the host), and says so in one line naming host and port, well within 60 s. The readers' lines are
        tested against a server that refuses at once (test_postgres_store.py): each would wait the same."""
        config = tmp_path / "mcplhost.toml"
        config.write_text(f'[store]\nurl = "{UNREACHABLE}"\n[host]\nname = "eu-1"\n')
        started = time.monotonic()
        result = cli_process("run", "--config", str(config), cwd=tmp_path, timeout=90)
        assert time.monotonic() - started < 60
        assert result.returncode == 1 and result.stdout == ""
        # Each retry is a log line (JSON, like every log line of run); the verdict is the one plain line.
        plain = [line for line in result.stderr.splitlines() if not line.startswith("{")]
        retries = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        assert {entry["event"] for entry in retries} <= {"store.server_unreachable"}
        assert "127.0.0.1:1" in one_line("\n".join(plain))  # the server it could not reach, by host and port
        # No database folder is made for a URL; the lock and children files are this host's, in the state folder.
        assert {p.name for p in tmp_path.iterdir()} <= {"eu-1.children", "eu-1.lock", "mcplhost.toml"}

    def test_path_and_url_together_is_one_line(self, tmp_path: Path) -> None:
        config = tmp_path / "mcplhost.toml"
        config.write_text(f'[store]\npath = "x.db"\nurl = "{UNREACHABLE}"\n')
        result = cli("run", "--config", str(config), cwd=tmp_path)
        assert result.returncode == 2
        assert "store.url: set together with path" in one_line(result.stderr)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["mcplhost.toml"]

    def test_check_config_lists_the_store_problems_without_the_password(self, tmp_path: Path) -> None:
        config = tmp_path / "mcplhost.toml"
        config.write_text(f'[store]\nurl = "{UNREACHABLE.replace("postgresql", "mysql")}"\nsynchronous = "FULL"\n'
                          '[host]\nname = "eu 1"\n')
        result = cli("check-config", str(config))
        assert result.returncode == 2 and SECRET not in result.stderr
        assert [line.partition(":")[0] for line in result.stderr.splitlines()] == [
            "host.name", "store.url", "store.synchronous"]
