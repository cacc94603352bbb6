"""`mcplhost run`: signals, fatal errors, logs and in-flight work as a real subprocess; config lookup in-process."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ..builders import message
from ..harness import CHAT_GRANT, CHAT_MANIFEST, PYTHON, alive, record, wait_for
from .support import cli, cli_env, cli_process, daemon, scripted_connector, write_config

CHANNEL = {"id": "disc:g1:room", "type": "disc", "label": "#room", "direction": "bidirectional", "address": {}}


def idle_chat(name: str, folder: Path, **fields: Any) -> dict[str, Any]:
    """A connector that registers its channel and then stays connected."""
    steps = [{"request": "channels/register", "params": {"channels": [{**CHANNEL, "id": f"{name}:g1:room"}]}}]
    return scripted_connector(name, {"manifest": CHAT_MANIFEST, "steps": steps}, folder, grant=CHAT_GRANT, **fields)


def stored_message_ids(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT json_extract(metadata, '$.messageId') FROM items").fetchall()
    return {row[0] for row in rows}


#: `mcplhost run ARGS` as the command runs it (mcplhost/__main__.py), with a real SIGINT raised at one moment of
#: the start: while the command's modules load (as `mcplhost.host` is imported), or once the event loop runs,
#: as the store is opened (when open_host is called).
INTERRUPTED_START = """
import signal, sys
moment = sys.argv[1]
if moment == "loading":
    class Interrupt:
        def find_spec(self, name, path=None, target=None):
            if name == "mcplhost.host":
                signal.raise_signal(signal.SIGINT)
            return None
    sys.meta_path.insert(0, Interrupt())
else:
    import mcplhost.cli.serve as serve
    opening = serve.open_host
    def interrupted(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        return opening(*args, **kwargs)
    serve.open_host = interrupted
sys.argv[1:] = ["run", *sys.argv[2:]]
from mcplhost.__main__ import main
sys.exit(main())
"""


class TestSignals:
    def test_the_suites_children_start_with_ctrl_c_handled(self) -> None:
        """A child of the suite handles SIGINT however the suite was started (tests/conftest.py): a background
        `pytest &` from a shell without job control ignores it, and a daemon would inherit that and ignore the
        SIGINT the tests below send (as `messages --follow` did, tests/cli/test_data.py TestFollow)."""
        shown = subprocess.run([PYTHON, "-c", "import signal; print(signal.getsignal(signal.SIGINT).__name__)"],
                               capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=True)
        assert shown.stdout.strip() == "default_int_handler"

    @pytest.mark.parametrize("moment", ["loading", "opening"])
    def test_a_ctrl_c_at_any_moment_of_the_start_is_a_quiet_exit_0(self, tmp_path, moment: str) -> None:
        """Ctrl-C while the modules load is exit 0 without a traceback (it printed the import's); once the loop
        runs it is the graceful stop, not a cancellation swallowed by the start (the daemon then ran on)."""
        config = write_config(tmp_path)
        run = subprocess.run([PYTHON, "-c", INTERRUPTED_START, moment, "--config", str(config)], env=cli_env(),
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
        events = [json.loads(line)["event"] for line in run.stderr.splitlines()]
        if moment == "loading":
            assert events == [] and run.stdout == ""
        else:
            assert "host.signal" in events and events[-1] == "host.stopped"

    @pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
    async def test_a_signal_stops_the_daemon_gracefully_with_exit_0(self, tmp_path, sig) -> None:
        """SIGTERM and SIGINT stop the connectors, then the store, and the daemon exits 0."""
        config = write_config(tmp_path, [idle_chat("disc", tmp_path)])
        async with daemon(config, tmp_path) as run:
            await run.wait_event("host.ready")
            await wait_for(lambda: record(tmp_path, "disc").done)
            run.signal(sig)
            assert await run.wait() == 0
        (start,) = [e for e in record(tmp_path, "disc").events if e["kind"] == "start"]
        assert not alive(start["pid"])
        order = [e["event"] for e in run.lines() if e["event"] in ("host.signal", "host.stopping", "connector.exited",
                                                                  "host.stopped")]
        assert order == ["host.signal", "host.stopping", "connector.exited", "host.stopped"]
        assert run.events("host.signal")[0]["signal"] == signal.Signals(sig).name
        assert run.events("connector.exited")[0]["how"] == "exited"

    async def test_sighup_reloads_and_the_daemon_keeps_running(self, tmp_path) -> None:
        """SIGHUP (reload, docs/operations.md#reload) never kills the daemon: an unchanged config changes nothing,
        the connector keeps its process, and SIGTERM still stops it."""
        config = write_config(tmp_path, [idle_chat("disc", tmp_path)])
        async with daemon(config, tmp_path) as run:
            await run.wait_event("host.ready")
            run.signal(signal.SIGHUP)
            await run.wait_event("host.reloaded")
            (start,) = [e for e in record(tmp_path, "disc").events if e["kind"] == "start"]
            assert alive(start["pid"])
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0

    async def test_in_flight_work_is_committed_on_sigterm(self, tmp_path) -> None:
        """Every message a connector got an accepted answer for before the stop is in the database afterwards."""
        batches = [{"requests": [["channels/incoming", {"messages": [message(CHANNEL["id"], f"m-{n}", f"message {n}")]}]
                                 for n in range(b * 25, b * 25 + 25)]}
                   for b in range(40)]
        steps = [{"request": "channels/register", "params": {"channels": [CHANNEL]}}, *batches]
        config = write_config(tmp_path, [scripted_connector("disc", {"manifest": CHAT_MANIFEST, "steps": steps},
                                                            tmp_path, grant=CHAT_GRANT)])

        def accepted() -> set[str]:
            """The message ids whose channels/incoming answer the connector received, accepting them."""
            seen = record(tmp_path, "disc")
            asked = {m["id"]: m["params"]["messages"][0]["messageId"] for m in seen.sent
                     if m.get("method") == "channels/incoming"}
            answers = [m for m in seen.received if "method" not in m and m.get("id") in asked]
            return {asked[m["id"]] for m in answers
                    if all(r.get("accepted") for r in m.get("result", {}).get("results", [{}]))}

        async with daemon(config, tmp_path) as run:
            await wait_for(lambda: len(accepted()) >= 100)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        acknowledged = accepted()
        assert len(acknowledged) < 1000, "the stream finished before the stop: nothing was in flight"
        assert acknowledged <= stored_message_ids(tmp_path / "host.db")


class TestFilesArePrivate:
    async def test_every_file_a_run_makes_under_umask_022_is_closed_to_others(self, tmp_path) -> None:
        """Started by hand under umask 022 (which made the database, WAL and SHM -rw-r--r--): the database, its
        WAL and SHM, the children file and the control socket are 0600, the lock 0640 (its group reads the
        pid); none gives others any access. A store file left readable by an older version is closed too."""
        config = write_config(tmp_path, [idle_chat("disc", tmp_path)])
        (tmp_path / "host.db.lock").write_text("", encoding="ascii")
        os.chmod(tmp_path / "host.db.lock", 0o644)  # as an older version left it
        async with daemon(config, tmp_path, umask=0o022) as run:
            await run.wait_event("host.ready")
            await wait_for(lambda: record(tmp_path, "disc").done)
            modes = {name: stat.S_IMODE(os.stat(tmp_path / name).st_mode) for name in
                     ("host.db", "host.db-wal", "host.db-shm", "host.db.children", "mcplhost.sock", "host.db.lock")}
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        assert modes == {"host.db": 0o600, "host.db-wal": 0o600, "host.db-shm": 0o600, "host.db.children": 0o600,
                         "mcplhost.sock": 0o600, "host.db.lock": 0o640}


class TestConfig:
    def test_an_invalid_config_exits_non_zero_with_one_clear_line(self, tmp_path) -> None:
        """A config problem is one stderr line naming the file and the field; no traceback, exit 2."""
        config = write_config(tmp_path, [{"name": "x", "command": ["true"], "restart": {"policy": "sometimes"}}])
        result = cli("run", "--config", str(config))
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        assert line.startswith("mcplhost: ") and str(config) in line
        assert "connectors[0].restart.policy" in line

    def test_a_missing_config_exits_non_zero_with_one_line(self, tmp_path) -> None:
        """A config file that does not exist is named on one line."""
        result = cli("run", "--config", str(tmp_path / "absent.toml"))
        assert result.returncode != 0
        (line,) = result.stderr.splitlines()
        assert "absent.toml: no such file" in line

    @pytest.mark.parametrize(("flag", "env", "cwd", "read"), [
        (True, True, True, "flag.toml"),
        (False, True, True, "env.toml"),
        (False, False, True, "mcplhost.toml"),
    ])
    def test_the_config_comes_from_the_flag_then_the_environment_then_the_working_folder(
        self, tmp_path, flag: bool, env: bool, cwd: bool, read: str
    ) -> None:
        """--config wins over $MCPLHOST_CONFIG, which wins over ./mcplhost.toml."""
        for name in ("flag.toml", "env.toml", "mcplhost.toml"):  # each broken in a way that names it
            (tmp_path / name).write_text(f'[store]\n"{name}" = 1\n', encoding="utf-8")
        args = ["run", *(["--config", str(tmp_path / "flag.toml")] if flag else [])]
        result = cli(*args, cwd=tmp_path, env={"MCPLHOST_CONFIG": str(tmp_path / "env.toml")} if env else {})
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        assert f"store.{read}: unknown key" in line, line

    def test_without_any_config_the_line_says_where_it_looked(self, tmp_path) -> None:
        """No flag, no variable and no ./mcplhost.toml: one line naming mcplhost.toml and how to pass one."""
        result = cli("run", cwd=tmp_path)
        assert result.returncode != 0
        (line,) = result.stderr.splitlines()
        assert "mcplhost.toml: no such file" in line and "--config" in line


class TestFatalStoreErrors:
    @pytest.mark.parametrize(("store", "says"), [
        ("file/host.db", "is not a folder"),
        ("absent/host.db", "absent does not exist"),
        ("folder", "is a directory, not a database file"),
    ])
    def test_a_store_path_that_cannot_be_a_database_exits_2_with_one_line(self, tmp_path, store: str,
                                                                          says: str) -> None:
        """A store.path under a file, in a missing folder (never created silently) or naming a folder: one line."""
        (tmp_path / "file").write_text("", encoding="utf-8")
        (tmp_path / "folder").mkdir()
        config = write_config(tmp_path, store=store)
        result = cli("run", "--config", str(config))
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        assert line.startswith("mcplhost: ") and "store.path: " in line and says in line, line
        assert not (tmp_path / "absent").exists()

    def test_a_store_that_cannot_be_opened_exits_1_with_one_line(self, tmp_path) -> None:
        """A database file that is not SQLite is a fatal store error: one stderr line, exit 1, no traceback."""
        (tmp_path / "host.db").write_bytes(b"not a database, " * 512)
        result = cli_process("run", "--config", str(write_config(tmp_path)))  # the host starts: a process of its own
        assert result.returncode == 1
        (line,) = result.stderr.splitlines()
        assert line.startswith("mcplhost: ") and "host.db" in line and "Traceback" not in result.stderr

    def test_a_database_newer_than_the_code_exits_non_zero_with_one_line(self, tmp_path) -> None:
        """A schema newer than this mcplhost is refused on one line that says what to do."""
        assert cli("migrate", "--db", str(tmp_path / "host.db")).returncode == 0
        with sqlite3.connect(tmp_path / "host.db") as conn:
            conn.execute("INSERT INTO schema_version (version, name, applied_at) VALUES (999, 'future', 0)")
        result = cli_process("run", "--config", str(write_config(tmp_path)))  # the host starts: a process of its own
        assert result.returncode == 1
        (line,) = result.stderr.splitlines()
        assert "schema version 999 is newer" in line and "restore" in line


class TestLogs:
    async def test_every_log_line_about_a_connector_carries_its_name(self, tmp_path) -> None:
        """The JSON lines of a run with a chatty, a crash-looping and a missing connector all name their connector."""
        looping = {"policy": "always", "backoff_initial_s": 0.05, "backoff_max_s": 0.2, "burst": 3, "window_s": 5}
        chatty = scripted_connector("chatty", {"manifest": CHAT_MANIFEST, "steps": [
            {"stderr": "a line of the connector's own", "repeat": 3}, {"raw": "not json"},
            {"request": "channels/register", "params": {"channels": [{**CHANNEL, "id": "elsewhere:room"}]}},
            {"request": "no/such/method"}]}, tmp_path, grant=CHAT_GRANT, channels=["chatty:*"])
        looper = scripted_connector("looper", {"after": "start", "steps": [{"exit": 1}]}, tmp_path, restart=looping)
        # An executable whose interpreter is gone: it passes the config check and fails to spawn.
        (tmp_path / "missing").write_text("#!/nonexistent/interpreter\n", encoding="utf-8")
        (tmp_path / "missing").chmod(0o755)
        ghost = {"name": "ghost", "command": [str(tmp_path / "missing")], "restart": looping}
        config = write_config(tmp_path, [chatty, looper, ghost])
        async with daemon(config, tmp_path) as run:
            await wait_for(lambda: record(tmp_path, "chatty").done and run.events("connector.slow_lane")
                           and len(run.events("connector.slow_lane", connector="ghost")) >= 1)
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        lines = run.lines()
        about_connectors = [e for e in lines if e["event"].split(".")[0] in ("connector", "rpc", "channels", "inbound")]
        assert {e["event"] for e in about_connectors} >= {
            "connector.spawned", "connector.up", "connector.stderr", "connector.exited", "connector.spawn_failed",
            "connector.restart_scheduled", "connector.slow_lane", "rpc.junk_line"}
        strays = [e for e in about_connectors if e.get("connector") not in ("chatty", "looper", "ghost")]
        assert not strays, strays
        assert all(isinstance(e.get("timestamp"), str) and "level" in e for e in lines)

    async def test_console_format_is_for_people(self, tmp_path) -> None:
        """--log-format console writes rendered lines, not JSON."""
        config = write_config(tmp_path)
        async with daemon(config, tmp_path, args=("--log-format", "console")) as run:
            await wait_for(lambda: "host.ready" in run.stderr())
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        ready = next(line for line in run.stderr().splitlines() if "host.ready" in line)
        with pytest.raises(json.JSONDecodeError):
            json.loads(ready)
