"""mcplhost/lock.py: one holder per database, the holder's pid in the lock file, released when the holder ends."""

from __future__ import annotations

import os
import subprocess

import msgspec
import pytest

from mcplhost.config import Config, HostConfig, daemon_lock
from mcplhost.lock import ONE_PER_HOST_NAME, DatabaseInUse, hold_database, lock_path, read_holder, refuse_if_held

from .harness import PYTHON, REPO


class TestHoldDatabase:
    def test_the_holder_writes_its_pid_beside_the_database(self, tmp_path) -> None:
        """<db>.lock holds the holder's pid as text while the lock is held."""
        db = tmp_path / "host.db"
        with hold_database(db) as path:
            assert path == lock_path(db) == tmp_path / "host.db.lock"
            assert path.read_text(encoding="ascii") == f"{os.getpid()}\n" and read_holder(path) == os.getpid()

    def test_a_second_holder_is_refused_with_the_first_ones_pid(self, tmp_path) -> None:
        """A second open of the same lock (another open file, as another process would have) is refused."""
        db = tmp_path / "host.db"
        with hold_database(db), pytest.raises(DatabaseInUse) as caught, hold_database(db):
            pass
        assert caught.value.holder == os.getpid()
        assert caught.value.message == f"{db}: in use by another mcplhost (pid {os.getpid()})"

    def test_a_postgresql_host_s_lock_is_named_by_its_host_name_in_the_state_folder(self, tmp_path) -> None:
        """With [store] url: `<host name>.lock` in the state folder, refused naming the host and the redacted URL;
        another host name beside it is free."""
        config = msgspec.convert({"store": {"url": "postgresql://u:hunter2-long@db/x", "state_dir": str(tmp_path)},
                                  "host": {"name": "eu-1"}}, Config)
        lock = daemon_lock(config)
        assert lock.path == tmp_path / "eu-1.lock"
        with hold_database(lock.subject, lock=lock.path, explanation=lock.explanation), \
                pytest.raises(DatabaseInUse) as caught:
            refuse_if_held(lock.subject, lock=lock.path, explanation=lock.explanation)
        assert caught.value.message == f"host eu-1 on postgresql://u:***@db/x: in use by another mcplhost (pid {os.getpid()})"
        assert caught.value.explanation == ONE_PER_HOST_NAME
        other = daemon_lock(msgspec.structs.replace(config, host=HostConfig(name="eu-2")))
        with hold_database(lock.subject, lock=lock.path), hold_database(other.subject, lock=other.path):
            assert sorted(p.name for p in tmp_path.iterdir()) == ["eu-1.lock", "eu-2.lock"]

    def test_the_lock_is_free_again_after_the_block(self, tmp_path) -> None:
        """Leaving the block releases the lock; the file stays (unlinking it would let two holders in)."""
        db = tmp_path / "host.db"
        with hold_database(db):
            pass
        with hold_database(db):
            pass
        assert lock_path(db).exists()

    def test_a_lock_held_by_a_dead_process_is_free(self, tmp_path) -> None:
        """A holder that ends without unlocking (here: exits without cleanup) leaves a stale file, not a lock."""
        db = tmp_path / "host.db"
        code = (f"import os; from mcplhost.lock import hold_database; from pathlib import Path\n"
                f"cm = hold_database(Path({str(db)!r})); cm.__enter__(); os._exit(0)")
        subprocess.run([PYTHON, "-c", code], check=True, cwd=REPO, timeout=30)
        assert read_holder(lock_path(db)) is not None  # its pid is still written
        with hold_database(db):
            assert read_holder(lock_path(db)) == os.getpid()

    def test_the_lock_is_not_inherited_by_children(self, tmp_path) -> None:
        """The descriptor is close-on-exec, so a connector never keeps the host's lock alive."""
        db = tmp_path / "host.db"
        with hold_database(db):
            listing = subprocess.run(["sh", "-c", "ls -l /proc/$$/fd"], capture_output=True, text=True, timeout=30)
        assert "host.db.lock" not in listing.stdout

    @pytest.mark.parametrize(("text", "holder"), [("", None), ("123\n", 123), ("garbage", None)])
    def test_the_pid_is_read_only_when_it_is_one(self, tmp_path, text: str, holder: int | None) -> None:
        """An empty or foreign lock file names no pid rather than a wrong one."""
        (tmp_path / "x.lock").write_text(text, encoding="ascii")
        assert read_holder(tmp_path / "x.lock") == holder
