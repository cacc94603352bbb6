"""The bundled connectors against one host: a deployed-style 0.4 heartbeat and a 0.5 stub (docs/mcpl-compat.md).

connectors.heartbeatish behaves like heartbeat-mcpl on the wire (version
"0.4", feature sets as an array, `uses: ["tools"]` yet it pushes, -32601 to
featureSets/update, a banner line on stdout, discord's host/command);
connectors.stub is a 0.5 chat connector. Both must reach ready in the same
host, and the heartbeat's pushes are stored unscoped with their origin kept
under metadata.adapter.
"""

from __future__ import annotations

from structlog.testing import capture_logs

from mcplhost.config import ConnectorConfig, RestartConfig

from ..builders import texts
from ..harness import PYTHON, REPO, config_with, items_when, logged, running_host, wait_for


def bundled(name: str, module: str, grant: list[str], **env: str) -> ConnectorConfig:
    return ConnectorConfig(name=name, command=[PYTHON, "-m", module], env={"PYTHONPATH": str(REPO), **env},
                           cwd=str(REPO), grant=grant, restart=RestartConfig(policy="never"), request_timeout_s=5.0)


class TestBundledConnectors:
    async def test_a_0_4_heartbeat_and_a_0_5_stub_both_reach_ready_and_are_stored(self, tmp_path) -> None:
        """The 0.4 heartbeat is ready via -32601 and stored `[source: heartbeat · unscoped]`; the 0.5 stub too."""
        heartbeat = bundled("heartbeat", "mcplhost.connectors.heartbeatish", ["pushEvents", "tools"],
                            HEARTBEAT_INTERVAL_S="0.05", HEARTBEAT_COUNT="2", HEARTBEAT_QUIRKS="banner,host_command")
        stub = bundled("stub", "mcplhost.connectors.stub", ["channels.register", "channels.incoming", "pushEvents"],
                       STUB_MESSAGES="5", STUB_INTERVAL_S="0.02")
        with capture_logs() as logs:
            async with running_host(config_with(tmp_path, heartbeat, stub)):
                items = await items_when(tmp_path, 7)
                # The heartbeat reports on stderr that its host/command was refused.
                await wait_for(lambda: any("host/command refused" in e.get("line", "")
                                           for e in logged(logs, "connector.stderr")))
        beats = [i for i in items if i.metadata["serverId"] == "heartbeat"]
        assert [texts(i.content) for i in beats] == [["[source: heartbeat · unscoped]", f"Heartbeat {n}: all quiet."]
                                             for n in (1, 2)]
        assert [i.metadata["adapter"] for i in beats] == [{"source": "heartbeat", "sequence": n} for n in (1, 2)]
        assert all(i.metadata["channelId"] is None and i.metadata["eventId"].startswith("heartbeat_") for i in beats)
        stubbed = [i for i in items if i.metadata["serverId"] == "stub"]
        assert len(stubbed) == 5
        assert {i.metadata["channelId"] for i in stubbed} == {"stub:g1:general", "stub:g1:random", None}
        assert logged(logs, "connector.initialized", connector="heartbeat", mcpl_version="0.4", legacy=True)
        assert logged(logs, "connector.legacy_policy", connector="heartbeat")
        assert logged(logs, "connector.initialized", connector="stub", mcpl_version="0.5", legacy=False)
        assert {e["connector"] for e in logged(logs, "connector.up", mode="ready")} == {"heartbeat", "stub"}
        assert logged(logs, "rpc.junk_line", connector="heartbeat")  # the banner, skipped
        assert logged(logs, "mcpl.refused", connector="heartbeat", method="host/command", code=-32601)

