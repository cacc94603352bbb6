"""No secret leaves through the control socket or /metrics (docs/agents.md#secrets, docs/operations.md#status-and-the-control-socket).

A connector whose `initialize` error holds its own token: `status --json`,
the plain table and restart-connector's refusal show `[redacted:NAME]`, as
its log line does, never the token. /metrics redacts its text the same way.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from mcplhost.config import ConnectorConfig, RestartConfig

from ..cli.support import cli, daemon, scripted_connector, write_config
from ..harness import config_with, wait_for
from ..memory_pair import memory_host
from ..metrics.test_metrics import scrape, with_metrics

TOKEN = "MTIzNDU2Nzg5MDEyMzQ1Njc4OTA"
REDACTED = "[redacted:DISC_TOKEN]"


class TestStatus:
    async def test_a_token_in_a_connectors_initialize_error_is_redacted_in_status_and_answers(self, tmp_path: Path):
        refusing = {"manifest": None, "handlers": {"initialize": {"error": {"code": -1, "message": TOKEN}}}}
        config = write_config(tmp_path, [scripted_connector("disc", refusing, tmp_path, env_file="disc.env",
                                                            restart={"policy": "never"})])
        env = tmp_path / "disc.env"
        env.write_text(f"DISC_TOKEN={TOKEN}\n")
        env.chmod(0o600)
        async with daemon(config, tmp_path) as run:
            failed = await run.wait_event("connector.handshake_failed", connector="disc")
            await run.wait_event("connector.stopped", connector="disc")
            as_json = cli("status", "--config", str(config), "--json")
            table = cli("status", "--config", str(config))
            restart = cli("restart-connector", "disc", "--config", str(config))  # its refusal names the last error
            run.signal(signal.SIGTERM)
            assert await run.wait() == 0
        assert REDACTED in failed["error"]  # the log line, as it was
        (disc,) = json.loads(as_json.stdout)["connectors"]
        assert disc["lastError"] == f"initialize failed: -1: {REDACTED}"
        assert REDACTED in table.stdout and restart.returncode == 1 and REDACTED in restart.stderr
        for shown in (as_json, table, restart):
            assert TOKEN not in shown.stdout + shown.stderr


class TestMetrics:
    async def test_the_scrape_is_redacted(self, tmp_path: Path) -> None:
        """A secret pasted as a connector's name (a label value) is redacted in /metrics as in a log line."""
        named = ConnectorConfig(name=TOKEN, command=["/bin/false"], env={"DISC_TOKEN": TOKEN},
                                restart=RestartConfig(policy="never"))
        async with memory_host(with_metrics(config_with(tmp_path, named)), wait_ready=False) as host:
            address = await wait_for(lambda: host.metrics_address)
            samples = await scrape(address)
        labels = {value for (_name, pairs) in samples for _key, value in pairs}
        assert REDACTED in labels and TOKEN not in labels
