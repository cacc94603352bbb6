"""Through `mcplhost run`: a connector that cannot start fails alone, and one installed later comes up."""

from __future__ import annotations

import os

from ..cli.support import cli, daemon, scripted_connector, write_config
from ..harness import CHAT_GRANT, CHAT_MANIFEST, PYTHON

#: Quick retries, so the test sees the installed binary picked up within a second or so.
QUICK_RESTART = {"policy": "on-failure", "backoff_initial_s": 0.1, "backoff_max_s": 0.5, "burst": 100,
                 "window_s": 60}


class TestAMissingCommand:
    async def test_run_starts_the_others_and_picks_the_binary_up_once_installed(self, tmp_path) -> None:
        """A missing command: check-config says so (exit 2); run logs spawn_failed, serves the rest, retries."""
        late = tmp_path / "bin" / "late-connector"
        steady = scripted_connector("steady", {"manifest": CHAT_MANIFEST}, tmp_path, grant=CHAT_GRANT)
        waiting = scripted_connector("late", {"manifest": CHAT_MANIFEST}, tmp_path, grant=CHAT_GRANT,
                                     command=[str(late)], restart=QUICK_RESTART)
        config = write_config(tmp_path, [steady, waiting])
        checked = cli("check-config", str(config))
        assert checked.returncode == 2 and f"connectors[1].command: '{late}' does not exist" in checked.stderr
        async with daemon(config, tmp_path) as run:
            failed = await run.wait_event("connector.spawn_failed", connector="late")
            assert "No such file or directory" in failed["error"]
            await run.wait_event("connector.up", connector="steady")
            await run.wait_event("connector.restart_scheduled", connector="late")
            assert run.process.returncode is None
            # Installed the way a package manager does: written aside, then renamed into place.
            late.parent.mkdir()
            aside = late.with_name(".late.tmp")
            aside.write_text(f"#!/bin/sh\nexec {PYTHON} -m tests.scripted_connector\n", encoding="utf-8")
            aside.chmod(0o755)
            os.rename(aside, late)
            await run.wait_event("connector.up", connector="late")
            run.signal(15)
            assert await run.wait() == 0

    async def test_with_policy_never_the_connector_is_stopped_with_the_reason(self, tmp_path) -> None:
        """Restart policy never: the one failed spawn leaves it stopped, saying why; the daemon keeps running."""
        steady = scripted_connector("steady", {"manifest": CHAT_MANIFEST}, tmp_path, grant=CHAT_GRANT)
        gone = scripted_connector("gone", {"manifest": CHAT_MANIFEST}, tmp_path, grant=CHAT_GRANT,
                                  command=["no-such-connector-h4"], restart={"policy": "never"})
        async with daemon(write_config(tmp_path, [steady, gone]), tmp_path) as run:
            stopped = await run.wait_event("connector.stopped", connector="gone")
            assert stopped["last"] == "spawn_failed" and stopped["reason"] == "restart policy is never"
            (failed,) = run.events("connector.spawn_failed", connector="gone")
            assert "no-such-connector-h4" in failed["error"]
            await run.wait_event("connector.up", connector="steady")
            run.signal(15)
            assert await run.wait() == 0
