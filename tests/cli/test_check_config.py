"""`mcplhost check-config PATH` (in-process): exit 0 on a good file, exit 2 listing every problem."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ..harness import PYTHON, REPO
from .support import cli

GOOD = """
[store]
path = "state/mcplhost.db"

[[connectors]]
name = "discord"
command = ["python", "-m", "mcplhost.connectors.stub"]
env = { GUILDS = "acme" }
grant = ["channels.register", "channels.incoming", "pushEvents"]
[connectors.restart]
policy = "always"

[[connectors]]
name = "heartbeat"
command = ["python", "-m", "mcplhost.connectors.heartbeatish"]

[[agents]]
name = "scout"
""".replace('"python"', json.dumps(PYTHON))  # Debian has no `python` on PATH; the command must be found

BAD = """
[store]
path = 3
colour = "blue"

[[connectors]]
name = "discord"
command = []
grant = ["channels..register"]
[connectors.restart]
policy = "sometimes"
burst = 0

[[connectors]]
name = "discord"
command = ["sh"]
request_timeout_s = -1

[[agents]]
name = "scout"
parent = "lead"
"""

#: "path.to.field: what is wrong", the path made of names and [index]es.
PROBLEM = re.compile(r"^[a-z_]+(\[\d+\])?(\.[a-z_]+(\[\d+\])?)*: \S.*$")


class TestCheckConfig:
    def test_a_good_file_exits_0_with_a_summary(self, tmp_path) -> None:
        """A valid file is confirmed on stdout with its counts, exit 0."""
        (tmp_path / "state").mkdir()
        (tmp_path / "good.toml").write_text(GOOD, encoding="utf-8")
        result = cli("check-config", str(tmp_path / "good.toml"))
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.splitlines() == ["ok: 2 connector(s), 1 agent(s), 1 warning(s)"]
        assert result.stderr.splitlines() == [
            "warning: connectors[1].grant: empty: no item from this connector will ever be accepted"]

    def test_an_empty_file_is_valid(self, tmp_path) -> None:
        """Connectors and agents may be absent: an empty file is a host with defaults."""
        (tmp_path / "empty.toml").write_text("", encoding="utf-8")
        result = cli("check-config", str(tmp_path / "empty.toml"))
        assert result.returncode == 0 and result.stdout.strip() == "ok: 0 connector(s), 0 agent(s)"

    def test_the_shipped_example_config_is_valid_once_installed(self, tmp_path) -> None:
        """deploy/mcplhost.example.toml passes its own check with this install standing in for /opt/mcplhost."""
        mcplhost = shutil.which("mcplhost", path=str(Path(PYTHON).parent))
        assert mcplhost, "the mcplhost script of this venv"
        text = (REPO / "deploy" / "mcplhost.example.toml").read_text(encoding="utf-8")
        assert "/opt/mcplhost/bin/mcplhost" in text and "/var/lib/mcplhost/" in text
        text = text.replace("/opt/mcplhost/bin/mcplhost", mcplhost).replace("/var/lib/mcplhost/", f"{tmp_path}/")
        assert 'env_file = "/etc/mcplhost/env/heartbeat.env"' in text  # install.sh makes it, 0600
        (tmp_path / "heartbeat.env").touch(mode=0o600)
        text = text.replace("/etc/mcplhost/env/", f"{tmp_path}/")
        (tmp_path / "mcplhost.toml").write_text(text, encoding="utf-8")
        result = cli("check-config", str(tmp_path / "mcplhost.toml"))
        assert result.returncode == 0 and result.stderr == "", result.stderr

    def test_a_bad_file_exits_2_with_every_problem_on_its_own_line(self, tmp_path) -> None:
        """All problems are listed at once, each as "path.to.field: what is wrong"."""
        (tmp_path / "bad.toml").write_text(BAD, encoding="utf-8")
        result = cli("check-config", str(tmp_path / "bad.toml"))
        assert result.returncode == 2 and result.stdout == ""
        lines = result.stderr.splitlines()
        assert all(PROBLEM.match(line) for line in lines), lines
        fields = [line.partition(":")[0] for line in lines]
        assert sorted(fields) == sorted([
            "store.path", "store.colour", "connectors[0].command", "connectors[0].grant[0]",
            "connectors[0].restart.policy", "connectors[0].restart.burst", "connectors[1].request_timeout_s",
            "connectors[1].name", "agents[0].parent",
        ])
        assert "store.colour: unknown key" in lines
        assert any(line.startswith("connectors[1].name: 'discord' is already used by connectors[0]") for line in lines)

    def test_a_missing_file_exits_2_with_one_line(self, tmp_path) -> None:
        """A path that does not exist is one line naming it."""
        result = cli("check-config", str(tmp_path / "absent.toml"))
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        assert "absent.toml: no such file" in line
        assert "--config" not in line  # check-config takes the path itself; advising --config misleads

    def test_invalid_toml_exits_2_with_one_line(self, tmp_path) -> None:
        """A syntax error is one line saying the file is not valid TOML, with where."""
        (tmp_path / "broken.toml").write_text("[store\npath = 1\n", encoding="utf-8")
        result = cli("check-config", str(tmp_path / "broken.toml"))
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        assert "broken.toml: not valid TOML" in line and "line 1" in line

    def test_check_config_and_run_report_a_problem_the_same_way_on_stderr(self, tmp_path) -> None:
        """A misspelled grant is a problem for both; both print it on stderr and exit 2."""
        (tmp_path / "bad.toml").write_text('[[connectors]]\nname = "a"\ncommand = ["sh"]\n'
                                           'grant = ["channels.incomming"]\n', encoding="utf-8")
        checked = cli("check-config", str(tmp_path / "bad.toml"))
        ran = cli("run", "--config", str(tmp_path / "bad.toml"))
        assert (checked.returncode, ran.returncode) == (2, 2) and checked.stdout == ran.stdout == ""
        (problem,) = checked.stderr.splitlines()
        assert problem.startswith("connectors[0].grant[0]: 'channels.incomming': 'incomming' is no capability "
                                  "under 'channels' (did you mean 'incoming'?)")
        (line,) = ran.stderr.splitlines()
        assert line.startswith("mcplhost: ") and problem in line

    def test_a_command_not_found_is_a_problem_for_check_config_only(self, tmp_path) -> None:
        """check-config exits 2 on a command not on PATH; run starts anyway (tests/e2e/test_connector_start.py)."""
        (tmp_path / "bad.toml").write_text('[[connectors]]\nname = "a"\ncommand = ["no-such-program-h4"]\n'
                                           'grant = ["pushEvents"]\n', encoding="utf-8")
        checked = cli("check-config", str(tmp_path / "bad.toml"))
        assert checked.returncode == 2
        (problem,) = checked.stderr.splitlines()
        assert problem.startswith("connectors[0].command: 'no-such-program-h4' is not found on PATH")

    def test_run_without_a_config_says_where_it_looked(self, tmp_path) -> None:
        """`run` with no --config and no MCPLHOST_CONFIG names ./mcplhost.toml and how to point elsewhere."""
        result = cli("run", cwd=tmp_path)
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        assert "mcplhost.toml: no such file" in line and "pass --config PATH or set MCPLHOST_CONFIG" in line


#: Five mistakes, each found by a different kind of check: types, cross-field rules, the filesystem, the grant
#: vocabulary, and the files a connector names.
FIVE_MISTAKES = """
[store]
path = "host.db"
colour = "blue"

[[connectors]]
name = "a"
command = ["no-such-program-h4"]
grant = ["channels.incomming"]

[[connectors]]
name = "b"
command = ["sh"]
grant = ["pushEvents"]
env_file = "loose.env"

[[agents]]
name = "scout"
parent = "lead"
"""


class TestOnePass:
    def test_five_planted_mistakes_of_different_phases_are_five_problems(self, tmp_path) -> None:
        """Schema, cross-field, command, grant and env-file problems all come out of one check-config run."""
        (tmp_path / "loose.env").write_text("TOKEN=t\n", encoding="utf-8")
        (tmp_path / "loose.env").chmod(0o644)
        (tmp_path / "five.toml").write_text(FIVE_MISTAKES, encoding="utf-8")
        result = cli("check-config", str(tmp_path / "five.toml"))
        assert result.returncode == 2
        found = result.stderr.splitlines()
        assert sorted(p.partition(":")[0] for p in found) == [
            "agents[0].parent", "connectors[0].command", "connectors[0].grant[0]", "connectors[1].env_file",
            "store.colour"], result.stderr
        assert all(PROBLEM.match(p) for p in found)

    def test_a_check_that_needs_a_bad_value_is_skipped_alone(self, tmp_path) -> None:
        """A cwd of the wrong type skips that connector's command check, not the other connector's or the grant's."""
        text = ('[[connectors]]\nname = "a"\ncommand = ["no-such-program-h4"]\ncwd = 3\ngrant = ["pushEvent"]\n'
                '[[connectors]]\nname = "b"\ncommand = ["no-such-program-h5"]\ngrant = ["pushEvents"]\n')
        (tmp_path / "skip.toml").write_text(text, encoding="utf-8")
        result = cli("check-config", str(tmp_path / "skip.toml"))
        assert [p.partition(":")[0] for p in result.stderr.splitlines()] == [
            "connectors[0].cwd", "connectors[0].grant[0]", "connectors[1].command"], result.stderr


#: Who the permission tests are, when this process is root (whom file modes do not stop).
NOBODY = 65534
#: A folder the permission tests' user may enter and read, but not write.
READ_ONLY_FOLDER = 0o555


@pytest.fixture
def shared_folder(monkeypatch) -> Iterator[Path]:
    """A folder any user may enter (pytest's own temporary folders are root's alone), the working folder too."""
    base = Path(tempfile.gettempdir())
    if not all(os.stat(f).st_mode & stat.S_IXOTH for f in (base, *base.parents)):
        base = Path("/tmp")
    folder = Path(tempfile.mkdtemp(prefix="mcplhost-perm-", dir=base))
    os.chmod(folder, 0o755)
    monkeypatch.chdir(folder)  # cli() returns to the working folder, which the denied user must be able to enter
    try:
        yield folder
    finally:
        for path in (folder, *folder.rglob("*")):
            if path.is_dir():
                os.chmod(path, 0o755)
        shutil.rmtree(folder)


@contextmanager
def denied(*folders: Path) -> Iterator[str]:
    """`folders` not writable for this process within the block, and the name it is known by: mode 0555, and
    as root this process's effective user is nobody meanwhile."""
    for folder in folders:
        os.chmod(folder, READ_ONLY_FOLDER)
    if os.geteuid() != 0:
        yield os.environ.get("USER") or str(os.geteuid())
        return
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield "nobody"
    finally:
        os.seteuid(0)
        os.setegid(0)


class TestPermissions:
    """check-config refuses what `run` would fail on in the file system, as the user it runs as."""

    def test_an_unwritable_store_or_socket_folder_fails_check_config_and_run_alike(self, shared_folder: Path) -> None:
        """The database's folder and the control socket's must let this user create files: both are problems
        for check-config (they passed, and run then failed on the lock file) and refuse run the same way."""
        state, sockets = shared_folder / "state", shared_folder / "sockets"
        state.mkdir()
        sockets.mkdir()
        config = shared_folder / "mcplhost.toml"
        config.write_text('[store]\npath = "state/host.db"\n[control]\nsocket = "../sockets/host.sock"\n',
                          encoding="utf-8")
        os.chmod(config, 0o644)
        assert cli("check-config", str(config), cwd=shared_folder).returncode == 0  # writable: nothing to say
        with denied(state, sockets) as user:
            checked = cli("check-config", str(config), cwd=shared_folder)
            ran = cli("run", "--config", str(config), cwd=shared_folder)
        assert checked.stderr.splitlines() == [
            f"store.path: the folder {state} is not writable by {user}: the database, its WAL and its lock are "
            "made there (run as the user who owns it, or give that user the folder)",
            f"control.socket: the folder {sockets} is not writable by {user}"]
        assert (checked.returncode, ran.returncode) == (2, 2)
        (line,) = ran.stderr.splitlines()
        assert line.startswith("mcplhost: ") and checked.stderr.splitlines()[0] in line
        assert not list(state.iterdir())

    def test_a_file_where_the_control_socket_goes_is_a_problem(self, tmp_path) -> None:
        """Run refuses to replace what is not a socket; check-config says so first. A socket there is fine (a
        killed daemon's is replaced at the start)."""
        (tmp_path / "mcplhost.toml").write_text('[store]\npath = "host.db"\n', encoding="utf-8")
        (tmp_path / "mcplhost.sock").write_text("notes", encoding="utf-8")
        checked = cli("check-config", str(tmp_path / "mcplhost.toml"))
        assert checked.returncode == 2
        assert checked.stderr.splitlines() == [f"control.socket: {tmp_path / 'mcplhost.sock'} exists and is not a "
                                               "socket (move it away, or set [control] socket to another path)"]
        (tmp_path / "mcplhost.sock").unlink()
        with socket.socket(socket.AF_UNIX) as stale:
            stale.bind(str(tmp_path / "mcplhost.sock"))
        assert cli("check-config", str(tmp_path / "mcplhost.toml")).returncode == 0
