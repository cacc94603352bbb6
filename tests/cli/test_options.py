"""Every option is validated: one stderr line and exit 2 for a bad value, never a traceback; `mcplhost connector`."""

from __future__ import annotations

import argparse
import math
import os
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.cli.common import MAX_COUNT, MAX_SECONDS, count, seconds

from ..harness import PYTHON, REPO
from .support import cli, cli_env

HUGE = "99999999999999999999999"


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    return line


class TestNumbers:
    @pytest.mark.parametrize("command", ["messages", "search"])
    @pytest.mark.parametrize("value", [HUGE, "-1", "ten", "1.5", "9" * 5000])
    def test_a_bad_limit_is_a_usage_error(self, tmp_path, command: str, value: str) -> None:
        """--limit past SQLite's integers, negative or not whole is exit 2 with one line, not OverflowError."""
        extra = ["query"] if command == "search" else []
        result = cli(command, "--db", str(tmp_path / "x.db"), *extra, "--limit", value)
        assert result.returncode == 2
        assert one_line(result).startswith(f"mcplhost {command}: argument --limit: ")

    def test_the_largest_limit_is_accepted(self, tmp_path) -> None:
        """--limit 2**63-1 means "all" and reaches the database without overflowing."""
        assert cli("migrate", "--db", str(tmp_path / "x.db")).returncode == 0
        result = cli("messages", "--db", str(tmp_path / "x.db"), "--limit", str(2**63 - 1))
        assert result.returncode == 0 and result.stderr == ""


class TestDatabasePaths:
    @pytest.mark.parametrize("command", [["messages"], ["search", "q"], ["migrate"], ["dev", "--seconds", "1"]])
    def test_an_empty_db_is_called_an_empty_path(self, command: list[str]) -> None:
        """--db '' is not quietly the current folder (it used to be reported as '.')."""
        result = cli(command[0], "--db", "", *command[1:])
        assert result.returncode == 2 and "argument --db: empty path" in one_line(result)

    @pytest.mark.parametrize("command", [["messages"], ["search", "q"], ["migrate"]])
    def test_a_directory_is_named_as_one(self, tmp_path, command: list[str]) -> None:
        """--db /tmp says it is a directory, not "no such database"."""
        result = cli(command[0], "--db", str(tmp_path), *command[1:])
        assert result.returncode == 1
        line = one_line(result)
        assert f"{tmp_path}" in line and "is a directory, not a database file" in line and "no such" not in line

    def test_a_missing_database_is_still_no_such_database(self, tmp_path) -> None:
        """A reader pointed at a file that does not exist says so and how to create one."""
        result = cli("messages", "--db", str(tmp_path / "absent.db"))
        assert result.returncode == 1 and "absent.db: no such database" in one_line(result)


class TestConnectorCommand:
    def test_list_names_the_bundled_connectors(self) -> None:
        """`mcplhost connector --list` prints one runnable connector per line."""
        result = cli("connector", "--list")
        assert result.returncode == 0 and {"stub", "heartbeatish", "zulipish"} <= set(result.stdout.split())
        assert "mcpl_server" not in result.stdout and "scripted" not in result.stdout

    @pytest.mark.parametrize(("args", "says"), [(["nosuch"], "no bundled connector is named 'nosuch'"),
                                               ([], "name a bundled connector")])
    def test_an_unknown_or_missing_name_is_a_usage_error(self, args: list[str], says: str) -> None:
        """The line lists what there is."""
        result = cli("connector", *args)
        assert result.returncode == 2
        line = one_line(result)
        assert says in line and "stub" in line

    def test_the_connector_replaces_the_process_and_gets_its_arguments(self) -> None:
        """The connector replaces the process (exec, so the supervisor's pid and signals reach it) and sees ARGS."""
        code = ("import os, sys; print(os.getpid(), flush=True); "
                "from mcplhost.cli import main; main(['connector', 'stub', '--help']); print('not replaced')")
        result = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=REPO,
                                timeout=60, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stderr
        pid, *rest = result.stdout.splitlines()
        assert "A stub chat connector" in "\n".join(rest) and "not replaced" not in result.stdout and int(pid) > 0

    def test_a_config_can_run_a_bundled_connector_without_python_on_path(self, tmp_path) -> None:
        """`command = [".../bin/mcplhost", "connector", "stub"]` passes check-config with PATH holding no python."""
        mcplhost = os.path.join(os.path.dirname(PYTHON), "mcplhost")
        (tmp_path / "c.toml").write_text(f'[[connectors]]\nname = "stub"\ncommand = ["{mcplhost}", "connector", '
                                         f'"stub"]\ngrant = ["channels.register", "channels.incoming"]\n',
                                         encoding="utf-8")
        result = cli("check-config", str(tmp_path / "c.toml"), env={"PATH": "/nonexistent"})
        assert result.returncode == 0, result.stderr


class TestOptionTypes:
    @given(st.one_of(st.text(), st.integers().map(str), st.floats().map(str)))
    def test_count_returns_a_bounded_int_or_a_usage_error(self, text: str) -> None:
        """Whatever is typed, `count` gives 0..MAX_COUNT or ArgumentTypeError, never another exception."""
        try:
            value = count(text)
        except argparse.ArgumentTypeError:
            return
        assert isinstance(value, int) and 0 <= value <= MAX_COUNT

    @given(st.one_of(st.text(), st.floats().map(str), st.integers().map(str)))
    def test_seconds_returns_a_finite_bounded_float_or_a_usage_error(self, text: str) -> None:
        """Whatever is typed, `seconds` gives a finite 0..MAX_SECONDS or ArgumentTypeError (nan and inf included)."""
        try:
            value = seconds(text)
        except argparse.ArgumentTypeError:
            return
        assert math.isfinite(value) and 0 <= value <= MAX_SECONDS
