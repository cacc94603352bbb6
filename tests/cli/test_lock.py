"""One daemon per database: a second run/dev/migrate refuses naming the holder's pid (the holder a real daemon)."""

from __future__ import annotations

import json
import os
import signal

from ..harness import PYTHON, REPO, alive, wait_for
from .support import cli, cli_process, daemon, write_config


def leaves_an_orphan(folder) -> dict:
    """A stub connector whose shell first starts a `sleep` that outlives the host (its pid in folder/orphan.pid)."""
    script = f"sleep 60 & echo $! > {folder}/orphan.pid; exec {PYTHON} -m mcplhost.connectors.stub"
    return {"name": "stub", "command": ["sh", "-c", script], "grant": ["channels.register", "channels.incoming"],
            "env": {"STUB_MESSAGES": "1", "PYTHONPATH": str(REPO)}, "restart": {"policy": "never"}}


class TestOneDaemonPerDatabase:
    async def test_a_second_run_refuses_with_one_line_naming_the_holder(self, tmp_path) -> None:
        """While one run holds the database, another run, dev and migrate exit 1 naming its pid; readers work."""
        config = write_config(tmp_path)
        db = tmp_path / "host.db"
        async with daemon(config, tmp_path) as first:
            await first.wait_event("host.ready")
            for args in (["run", "--config", str(config)], ["dev", "--db", str(db), "--seconds", "5"],
                         ["migrate", "--db", str(db)]):
                # `run` gets as far as marking its process non-dumpable before it meets the lock: a process of its own
                result = cli_process(*args) if args[0] == "run" else cli(*args)
                assert result.returncode == 1, (args, result.stderr)
                (line,) = result.stderr.splitlines()
                assert line.startswith(f"mcplhost: {db}: in use by another mcplhost (pid {first.pid})"), line
            assert cli("messages", "--db", str(db)).returncode == 0
            assert cli("search", "--db", str(db), "anything").returncode == 0
            first.signal(signal.SIGTERM)
            assert await first.wait() == 0
        assert cli("migrate", "--db", str(db)).returncode == 0  # free once the daemon has stopped

    async def test_kill_9_of_the_holder_frees_the_database_for_a_clean_start(self, tmp_path) -> None:
        """The kernel drops a killed holder's lock, even while its orphaned connector lives on."""
        config = write_config(tmp_path, [leaves_an_orphan(tmp_path)])
        orphan = None
        try:
            async with daemon(config, tmp_path) as first:
                await first.wait_event("host.ready")
                orphan = int(await wait_for(lambda: (tmp_path / "orphan.pid").read_text().strip()
                                            if (tmp_path / "orphan.pid").exists() else None))
                first.signal(signal.SIGKILL)
                assert await first.wait() == -signal.SIGKILL
            assert alive(orphan)  # the connector's child outlived the host (a lock it inherited would stay held)
            async with daemon(config, tmp_path) as second:
                await second.wait_event("host.ready")
                assert (tmp_path / "host.db.lock").read_text(encoding="ascii").strip() == str(second.pid)
                second.signal(signal.SIGTERM)
                assert await second.wait() == 0
        finally:
            if orphan is not None and alive(orphan):
                os.kill(orphan, signal.SIGKILL)
                await wait_for(lambda: not alive(orphan))

    def test_the_refusal_is_the_same_for_a_relative_db_path(self, tmp_path) -> None:
        """`migrate --db host.db` from the database's folder is refused by a holder of the absolute path."""
        from mcplhost.lock import hold_database

        with hold_database(tmp_path / "host.db"):
            result = cli("migrate", "--db", "host.db", cwd=tmp_path)
        assert result.returncode == 1 and f"(pid {os.getpid()})" in result.stderr


class TestAnotherDaemonsAddresses:
    async def test_a_start_refused_for_anothers_socket_or_port_leaves_nothing_behind(self, tmp_path) -> None:
        """A second daemon on its own database, configured with the first one's control socket or metrics port,
        exits 1 with one line, and its folder holds no new database, lock or children file (it made all three
        before the socket or the port refused it)."""
        first = tmp_path / "first"
        first.mkdir()
        config = write_config(first)
        config.write_text(config.read_text() + '[metrics]\nlisten = "127.0.0.1:0"\n', encoding="utf-8")
        async with daemon(config, first) as running:
            await running.wait_event("host.ready")
            port = (await running.wait_event("metrics.listening"))["address"]
            socket_path = first / "mcplhost.sock"
            for table, refused in ((f"[control]\nsocket = {json.dumps(str(socket_path))}\n",
                                    f"control socket {socket_path}: another daemon answers on it"),
                                   (f'[metrics]\nlisten = "{port}"\n', f"metrics.listen: cannot listen on {port}: ")):
                second = tmp_path / f"second-{len(list(tmp_path.iterdir()))}"
                second.mkdir()
                other = write_config(second)
                other.write_text(other.read_text() + table, encoding="utf-8")
                result = cli_process("run", "--config", str(other))
                assert result.returncode == 1, result.stderr
                (line,) = result.stderr.splitlines()
                assert line.startswith(f"mcplhost: {refused}"), line
                assert sorted(p.name for p in second.iterdir()) == ["mcplhost.toml"]
            running.signal(signal.SIGTERM)
            assert await running.wait() == 0
