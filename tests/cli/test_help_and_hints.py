"""Small promises of the command line: what --help and error hints say, and what git never picks up."""

from __future__ import annotations

import subprocess

from ..harness import REPO
from .support import cli


class TestHelpAndHints:
    def test_run_help_names_every_command_that_needs_no_lock(self) -> None:
        """`run --help` lists messages, search, turns and outbox as the commands that take no lock."""
        text = " ".join(cli("run", "--help").stdout.split())
        assert "(messages, search, turns and outbox need no lock)" in text

    def test_a_reader_on_a_file_that_is_no_database_is_told_about_db(self, tmp_path) -> None:
        """`messages --db FILE` on a text file: one line whose hint talks about --db, not store.path."""
        text = tmp_path / "notes.txt"
        text.write_text("hello\n" * 100, encoding="utf-8")
        result = cli("messages", "--db", str(text))
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert "--db names an mcplhost database" in result.stderr and "store.path" not in result.stderr

    def test_the_dev_database_and_its_lock_are_ignored_by_git(self) -> None:
        """`mcplhost dev` leaves mcplhost-dev.db, its lock and its runtime file of children: git ignores them."""
        for name in ("mcplhost-dev.db", "mcplhost-dev.db.lock", "state/mcplhost.db.lock", "mcplhost-dev.db.children"):
            result = subprocess.run(["git", "check-ignore", "-q", name], cwd=REPO, timeout=30)
            assert result.returncode == 0, f"{name} is not ignored"
