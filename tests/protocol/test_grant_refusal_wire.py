"""A call refused for a missing grant, on the wire: the first per capability is a warning naming the fix."""

from __future__ import annotations

from structlog.testing import capture_logs

from ..builders import push
from ..harness import CHAT_MANIFEST, config_with, error_of, logged, record, scripted, wait_for
from ..memory_pair import memory_host


class TestMissingGrantWarning:
    async def test_the_first_refusal_warns_with_the_grant_to_add_and_later_ones_stay_info(self, tmp_path) -> None:
        """Three pushes without pushEvents granted: three -32002 and info lines, one warning naming the key."""
        steps = [{"request": "push/event", "params": push(f"e-{n}")} for n in range(3)]
        spec = scripted("nogrant", {"manifest": CHAT_MANIFEST, "steps": steps}, tmp_path,
                        grant=["channels.register", "channels.incoming"])
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "nogrant").done)
        rec = record(tmp_path, "nogrant")
        assert [error_of(rec, n)["code"] for n in range(3)] == [-32002] * 3
        assert len(logged(logs, "mcpl.refused", connector="nogrant", capability="pushEvents")) == 3
        (warning,) = logged(logs, "connector.grant_missing", connector="nogrant")
        assert warning["log_level"] == "warning" and warning["capability"] == "pushEvents"
        assert warning["hint"] == "add \"pushEvents\" to this connector's grant in the config"

    async def test_a_capability_the_connector_never_advertised_is_not_blamed_on_the_grant(self, tmp_path) -> None:
        """Granted but not advertised: the warning says the connector did not advertise it."""
        manifest = {k: v for k, v in CHAT_MANIFEST.items() if k != "pushEvents"}
        spec = scripted("unadvertised", {"manifest": manifest, "steps": [{"request": "push/event", "params": push()}]},
                        tmp_path, grant=["pushEvents", "channels.register", "channels.incoming"])
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "unadvertised").done)
        (warning,) = logged(logs, "connector.grant_missing", connector="unadvertised")
        assert "did not advertise pushEvents" in warning["hint"]
