"""Through `mcplhost run`: a daemon killed with SIGKILL takes its connectors with it."""

from __future__ import annotations

import os
import signal

from ..cli.support import daemon, scripted_connector, write_config
from ..harness import CHAT_GRANT, CHAT_MANIFEST, alive, record, wait_for


class TestHostDeath:
    async def test_a_connector_ignoring_eof_and_sigterm_dies_with_a_killed_daemon(self, tmp_path) -> None:
        """kill -9 of `mcplhost run`: the connector, which ignores stdin's end and SIGTERM, is gone too."""
        stubborn = scripted_connector("stubborn", {"manifest": CHAT_MANIFEST, "ignore_eof": True,
                                                   "ignore_sigterm": True}, tmp_path, grant=CHAT_GRANT)
        async with daemon(write_config(tmp_path, [stubborn]), tmp_path) as run:
            await run.wait_event("connector.up", connector="stubborn")
            (start,) = [e for e in record(tmp_path, "stubborn").events if e["kind"] == "start"]
            child = start["pid"]
            try:
                assert alive(child)
                run.signal(signal.SIGKILL)
                assert await run.wait() == -signal.SIGKILL
                await wait_for(lambda: not alive(child), timeout=10)
            finally:
                if alive(child):  # a failed run of this test must not leave the orphan behind
                    os.kill(child, signal.SIGKILL)

    async def test_what_a_connector_started_is_stopped_by_the_next_start(self, tmp_path) -> None:
        """The connector's own child outlives the parent-death signal; the next `run` on the database kills it."""
        helper_pid = tmp_path / "helper.pid"
        parent = scripted_connector("parent", {"manifest": CHAT_MANIFEST}, tmp_path, grant=CHAT_GRANT)
        parent["command"] = ["sh", "-c", f'sleep 300 & echo $! > {helper_pid}; exec "$@"', "sh", *parent["command"]]
        config = write_config(tmp_path, [parent])
        helper = None
        try:
            async with daemon(config, tmp_path) as run:
                await run.wait_event("connector.up", connector="parent")
                helper = int(helper_pid.read_text(encoding="ascii"))
                (leader,) = [e["pid"] for e in record(tmp_path, "parent").events if e["kind"] == "start"]
                assert (tmp_path / "host.db.children").read_text(encoding="ascii").split()[0] == str(leader)
                run.signal(signal.SIGKILL)
                await run.wait()
            await wait_for(lambda: not alive(leader), timeout=10)
            assert alive(helper)  # in the connector's group, but no child of the daemon: the signal missed it
            async with daemon(config, tmp_path) as run:
                stopped = await run.wait_event("host.leftovers_stopped")
                assert helper in stopped["pids"]
                await wait_for(lambda: not alive(helper), timeout=10)
                await run.wait_event("connector.up", connector="parent")
                run.signal(signal.SIGTERM)
                assert await run.wait() == 0
            assert (tmp_path / "host.db.children").read_text(encoding="ascii") == ""  # a clean stop leaves none
        finally:
            for pid in filter(None, [helper, *self.helpers(helper_pid)]):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)

    @staticmethod
    def helpers(path) -> list[int]:
        text = path.read_text(encoding="ascii").strip() if path.exists() else ""
        return [int(text)] if text.isdecimal() else []
