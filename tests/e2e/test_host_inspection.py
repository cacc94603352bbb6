"""A process running as the daemon's user cannot read the daemon's environment (its api keys) once it is hardened.

Connectors run as the daemon's user, so only the daemon being non-dumpable
(mcplhost/hardening.py, called by `mcplhost run` before any child starts)
keeps `/proc/<daemon>/environ` closed to them. Root reads every process's
/proc files, so both processes here run as `nobody` (setpriv), as a service
user would; the same setup without the hardening reads the key, so the test
can fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from ..harness import PYTHON, REPO

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


@pytest.fixture
def as_nobody() -> Iterator[None]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not sys.platform.startswith("linux"):
        pytest.skip("runs two processes as another user: needs root, setpriv and Linux (CI has them)")
    yield


def peek(mode: str) -> tuple[str, subprocess.CompletedProcess[bytes]]:
    """Start the stand-in daemon as nobody with the key in its environment; read its environ as nobody too."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "MCPLHOST_TEST_AGENT_KEY": SECRET}
    with subprocess.Popen([*AS_NOBODY, PYTHON, "-c", DAEMON, mode], env=env, cwd="/",
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as daemon:
        assert daemon.stdout is not None and daemon.stdin is not None
        hardened = daemon.stdout.readline().strip()
        try:
            return hardened, subprocess.run([*AS_NOBODY, "/bin/cat", f"/proc/{daemon.pid}/environ"],
                                            capture_output=True, timeout=30)
        finally:
            daemon.stdin.close()


class TestDaemonInspection:
    def test_a_same_user_process_cannot_read_a_hardened_daemons_environment(self, as_nobody: None) -> None:
        hardened, looked = peek("harden")
        assert hardened == "True"
        assert looked.returncode != 0 and SECRET.encode() not in looked.stdout
        assert b"Permission denied" in looked.stderr

    def test_without_the_hardening_the_same_user_reads_the_key(self, as_nobody: None) -> None:
        """The control: what the hardening closes is really open otherwise."""
        hardened, looked = peek("leave")
        assert hardened == "False"
        assert looked.returncode == 0 and SECRET.encode() in looked.stdout
