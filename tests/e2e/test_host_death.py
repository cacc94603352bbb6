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
