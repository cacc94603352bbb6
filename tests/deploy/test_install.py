"""deploy/: the systemd unit passes `systemd-analyze verify`, and install.sh's recipe yields a service that runs.

The recipe test does what the README's deploy steps do, on this machine as far as a machine without systemd
as PID 1 allows: install.sh with a throwaway system user into a temporary prefix, then `mcplhost run` as
that user (setpriv, as systemd's User= would), READY=1 on a notify socket, items stored, SIGTERM, exit 0.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..cli.support import NotifySocket, cli
from ..harness import PYTHON, REPO, wait_for

DEPLOY = REPO / "deploy"
#: The interpreter install.sh uses by default on Debian/Ubuntu; readable by every user, unlike a pyenv under /root.
SYSTEM_PYTHON = Path("/usr/bin/python3")
#: A fresh venv and a pip install from the clone take a few seconds; a busy machine takes longer.
INSTALL_TIMEOUT_S = 300

needs_verify = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                  reason="systemd-analyze is not installed here (it ships with systemd)")


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120)


@needs_verify
def test_the_shipped_unit_verifies_with_its_commands_in_place(tmp_path) -> None:
    """`systemd-analyze verify` finds no problem in deploy/mcplhost.service (ExecStart pointed at this venv).

    verify also checks that ExecStart's and ExecReload's programs exist and are executable.
    """
    mcplhost = Path(PYTHON).parent / "mcplhost"
    text = (DEPLOY / "mcplhost.service").read_text(encoding="utf-8")
    assert "ExecStart=/opt/mcplhost/bin/mcplhost run --config /etc/mcplhost/mcplhost.toml" in text
    assert "StateDirectory=mcplhost" in text and "Type=notify" in text
    # systemctl reload: SIGHUP to the daemon alone, which reloads its config (docs/operations.md#reload).
    assert unit_lines(text)["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    unit = tmp_path / "mcplhost.service"
    unit.write_text(text.replace("/opt/mcplhost/bin/mcplhost", str(mcplhost)), encoding="utf-8")
    result = verify(unit)
    assert result.returncode == 0 and result.stderr == "" and result.stdout == "", result.stderr


def test_the_install_script_is_valid_shell_with_help() -> None:
    """install.sh parses as POSIX sh and `--help` lists its steps and overrides without needing root."""
    assert subprocess.run(["sh", "-n", str(DEPLOY / "install.sh")], timeout=30).returncode == 0
    result = subprocess.run(["sh", str(DEPLOY / "install.sh"), "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "MCPLHOST_PREFIX" in result.stdout and "systemctl enable" in result.stdout


def unit_lines(text: str) -> dict[str, list[str]]:
    """The unit's settings: each key's values, in order, comments left out."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, equals, value = line.partition("=")
        if equals and not line.startswith(("#", "[")):
            found.setdefault(key, []).append(value)
    return found


def print_unit(**places: str) -> dict[str, list[str]]:
    result = subprocess.run(["sh", str(DEPLOY / "install.sh"), "--print-unit"], capture_output=True, text=True,
                            env={**os.environ, **places}, timeout=30)
    assert result.returncode == 0, result.stderr
    return unit_lines(result.stdout)


@pytest.mark.parametrize(("state_dir", "state_directory"), [
    ("/var/lib/mcplhost", ["mcplhost"]), ("/var/lib/bots/mcplhost", ["bots/mcplhost"]), ("/srv/mcplhost", None),
])
def test_the_unit_follows_the_state_dir_everywhere_it_names_it(state_dir: str, state_directory: list[str] | None) -> None:
    """MCPLHOST_STATE_DIR sets WorkingDirectory=, ReadWritePaths= and (under /var/lib) StateDirectory= alike."""
    lines = print_unit(MCPLHOST_STATE_DIR=state_dir, MCPLHOST_CONFIG_DIR="/etc/bots", MCPLHOST_PREFIX="/opt/bots")
    assert lines["WorkingDirectory"] == lines["ReadWritePaths"] == [state_dir]
    assert lines.get("StateDirectory") == state_directory
    assert ("StateDirectoryMode" in lines) == (state_directory is not None)
    assert lines["ExecStart"] == ["/opt/bots/bin/mcplhost run --config /etc/bots/mcplhost.toml"]
    assert lines["EnvironmentFile"] == ["-/etc/bots/secrets.env"]
    assert not [v for values in lines.values() for v in values if "/var/lib/mcplhost" in v and state_dir != "/var/lib/mcplhost"]


@pytest.fixture
def throwaway_user() -> Iterator[str]:
    """A name for a system user that install.sh creates; the user and its group are deleted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("the recipe test creates a system user and runs as it: it needs root (CI runs as root)")
    for tool in ("useradd", "userdel", "setpriv", "runuser"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed here")
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"{SYSTEM_PYTHON} is missing: not a Debian/Ubuntu layout")
    name = f"mcplh-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=60)
        subprocess.run(["groupdel", name], capture_output=True, timeout=60)


@pytest.fixture
def public_folder() -> Iterator[Path]:
    """A temporary folder other users can search (pytest's own are private to root), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="mcplhost-deploy-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


#: The whole test: the install's own bound, then the run (ready, two heartbeats, a stop). pytest-timeout's default
#: (120 s, pyproject.toml) is below the install's bound; the recipe took 25 s quiet and 59 s under load here.
INSTALL_TEST_TIMEOUT_S = INSTALL_TIMEOUT_S + 180


@pytest.mark.timeout(INSTALL_TEST_TIMEOUT_S)
async def test_the_recipe_installs_a_service_that_runs_as_its_user(tmp_path, throwaway_user: str,
                                                                   public_folder: Path) -> None:
    """install.sh → user, venv, group-readable config, state dir, unit; `run` as that user stores and stops cleanly."""
    base = public_folder
    if not all(mode(parent) & 0o001 for parent in base.parents):
        pytest.skip(f"a parent of {base} is not searchable by other users, so no service user could reach it")
    places = {"MCPLHOST_USER": throwaway_user, "MCPLHOST_PREFIX": str(base / "opt"),
              "MCPLHOST_CONFIG_DIR": str(base / "etc"), "MCPLHOST_STATE_DIR": str(base / "state"),
              "MCPLHOST_UNIT_DIR": str(base / "units"), "MCPLHOST_SYSTEMCTL": "no",
              "MCPLHOST_PYTHON": str(SYSTEM_PYTHON)}
    installed = subprocess.run(["sh", str(DEPLOY / "install.sh"), "--source", str(REPO)], capture_output=True,
                               text=True, env={**os.environ, **places}, timeout=INSTALL_TIMEOUT_S)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "ok: 1 connector(s)" in installed.stdout  # check-config, run as the service user

    mcplhost, config, state = base / "opt" / "bin" / "mcplhost", base / "etc" / "mcplhost.toml", base / "state"
    group = subprocess.run(["id", "-gn", throwaway_user], capture_output=True, text=True, check=True).stdout.strip()
    assert mode(base / "etc") == 0o750 and mode(config) == 0o640
    assert (base / "etc").group() == config.group() == group and config.owner() == "root"
    assert state.owner() == throwaway_user and mode(state) == 0o750
    assert f'command = ["{mcplhost}", "connector", "heartbeatish"]' in config.read_text(encoding="utf-8")
    unit = base / "units" / "mcplhost.service"
    assert f"ExecStart={mcplhost} run --config {config}" in unit.read_text(encoding="utf-8")
    assert f"User={throwaway_user}" in unit.read_text(encoding="utf-8")
    # The unit's state folder is the config's: where store.path is, writable under ProtectSystem=strict.
    store_folder = str(Path(tomllib.loads(config.read_text(encoding="utf-8"))["store"]["path"]).parent)
    assert store_folder == str(state)
    lines = unit_lines(unit.read_text(encoding="utf-8"))
    assert lines["WorkingDirectory"] == lines["ReadWritePaths"] == [store_folder]
    assert "StateDirectory" not in lines  # not under /var/lib: install.sh made the folder itself
    # One env file per connector, the service user's alone; the heartbeat's is the one its config names.
    envs, heartbeat_env = base / "etc" / "env", base / "etc" / "env" / "heartbeat.env"
    assert envs.owner() == heartbeat_env.owner() == throwaway_user
    assert mode(envs) == 0o700 and mode(heartbeat_env) == 0o600
    assert f'env_file = "{heartbeat_env}"' in config.read_text(encoding="utf-8")
    with heartbeat_env.open("a", encoding="utf-8") as file:  # its settings reach it only through its env file
        file.write("HEARTBEAT_INTERVAL_S=0.2\n")
    if shutil.which("systemd-analyze"):
        verified = verify(unit)
        assert verified.returncode == 0 and verified.stderr == "", verified.stderr

    # What systemd would do: start `run` as the user, notify socket set, a short heartbeat so items arrive soon.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(state), "LANG": "C.UTF-8"}
    argv = ["setpriv", f"--reuid={throwaway_user}", f"--regid={group}", "--init-groups", "--",
            str(mcplhost), "run", "--config", str(config)]
    with NotifySocket.abstract() as sock, open(tmp_path / "run.log", "wb") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=state,
                                   env={**env, "NOTIFY_SOCKET": sock.address})
        try:
            await sock.wait("READY=1", timeout=60)
            db = state / "mcplhost.db"
            await wait_for(lambda: "Heartbeat 2" in cli("messages", "--db", str(db)).stdout, timeout=30)
            assert (state / "mcplhost.db.lock").read_text(encoding="ascii").strip() == str(process.pid)
            assert db.owner() == throwaway_user
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0, (tmp_path / "run.log").read_text(errors="replace")
            assert "STOPPING=1" in sock.poll()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
