"""A process running as the daemon's user cannot read the daemon's environment (its api keys) once it is hardened.

Connectors run as the daemon's user, so only the daemon being non-dumpable
(mcplhost/hardening.py, called by `mcplhost run` before any child starts)
keeps `/proc/<daemon>/environ` closed to them. Root reads every process's
/proc files, so both processes here run as `nobody` (setpriv), as a service
user would; the same setup without the hardening reads the key, so the test
can fail.

`nobody` may not be able to enter the checkout (a clone in a 0700 home), so
what the stand-in daemon runs is staged where it can: the package's two
modules it imports (hardening.py is a leaf of the standard library) in a
world-readable temporary folder, run by an interpreter outside any venv.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..harness import REPO

AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
SECRET = "sk-daemon-secret"

#: The daemon's part: harden (or not), say so, then wait for stdin to close.
DAEMON = """
import sys
from mcplhost.hardening import refuse_inspection_by_same_user
hardened = refuse_inspection_by_same_user() if sys.argv[1] == "harden" else False
print(hardened, flush=True)
sys.stdin.read()
"""


#: What the stand-in daemon imports of the package.
STAGED_MODULES = ("__init__.py", "hardening.py")
#: A staged folder's mode and its files': anyone may read them.
READABLE_FOLDER, READABLE_FILE = 0o755, 0o644
#: Where a staged folder goes when the temporary folder's own path is closed to others.
SHARED_TMP = "/tmp"
ENV = {"PATH": "/usr/bin:/bin"}


class Staged:
    """Where nobody finds the stand-in daemon's interpreter and modules."""

    def __init__(self, python: str, folder: Path) -> None:
        self.python = python
        self.folder = folder


def open_to_others(path: Path) -> bool:
    """Whether every folder from / down to `path` lets others through."""
    return all(os.stat(folder).st_mode & stat.S_IXOTH for folder in (path, *path.parents))


def runs_as_nobody(python: str) -> bool:
    return subprocess.run([*AS_NOBODY, python, "-c", "import ctypes"], env=ENV, cwd="/",
                          capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="module")
def staged() -> Iterator[Staged]:
    """The modules copied into a folder nobody can read, and an interpreter nobody can run: this one's own file
    (a venv's python is a link to it, and the venv may sit in the unreadable checkout), else the system's."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not sys.platform.startswith("linux"):
        pytest.skip("runs two processes as another user: needs root, setpriv and Linux (CI has them)")
    python = next((p for p in (os.path.realpath(sys.executable), "/usr/bin/python3") if runs_as_nobody(p)), None)
    if python is None:
        pytest.skip("no Python interpreter here that the user nobody may run")
    base = Path(tempfile.gettempdir())
    folder = Path(tempfile.mkdtemp(prefix="mcplhost-nobody-", dir=base if open_to_others(base) else SHARED_TMP))
    try:
        package = folder / "mcplhost"
        package.mkdir()
        for name in STAGED_MODULES:
            shutil.copyfile(REPO / "mcplhost" / name, package / name)
            os.chmod(package / name, READABLE_FILE)
        for path in (folder, package):
            os.chmod(path, READABLE_FOLDER)
        yield Staged(python, folder)
    finally:
        shutil.rmtree(folder)


def peek(staged: Staged, mode: str) -> tuple[str, subprocess.CompletedProcess[bytes]]:
    """Start the stand-in daemon as nobody with the key in its environment; read its environ as nobody too."""
    env = {**ENV, "PYTHONPATH": str(staged.folder), "MCPLHOST_TEST_AGENT_KEY": SECRET}
    with subprocess.Popen([*AS_NOBODY, staged.python, "-c", DAEMON, mode], env=env, cwd="/",
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as daemon:
        assert daemon.stdout is not None and daemon.stdin is not None
        hardened = daemon.stdout.readline().strip()
        try:
            return hardened, subprocess.run([*AS_NOBODY, "/bin/cat", f"/proc/{daemon.pid}/environ"],
                                            capture_output=True, timeout=30)
        finally:
            daemon.stdin.close()


class TestDaemonInspection:
    def test_a_same_user_process_cannot_read_a_hardened_daemons_environment(self, staged: Staged) -> None:
        hardened, looked = peek(staged, "harden")
        assert hardened == "True"
        assert looked.returncode != 0 and SECRET.encode() not in looked.stdout
        assert b"Permission denied" in looked.stderr

    def test_without_the_hardening_the_same_user_reads_the_key(self, staged: Staged) -> None:
        """The control: what the hardening closes is really open otherwise."""
        hardened, looked = peek(staged, "leave")
        assert hardened == "False"
        assert looked.returncode == 0 and SECRET.encode() in looked.stdout
