"""The one method table: every inbound method, its capability and its handlers."""

from __future__ import annotations

from mcplhost.protocol.grants import IMPLEMENTED, offered_paths
from mcplhost.protocol.methods import INBOUND, MCP_NOTIFICATIONS_PREFIX, REMOVED, method_for
from mcplhost.protocol.vocabulary import CAPABILITY_PATHS


class TestTable:
    def test_every_entry_needs_a_vocabulary_capability_or_none_and_has_a_handler(self) -> None:
        """A capability is one of the 17 paths (or ungated), and each method is valid as at least one kind."""
        for name, entry in INBOUND.items():
            assert entry.capability is None or entry.capability in CAPABILITY_PATHS, name
            assert entry.request is not None or entry.notification is not None, name

    def test_removed_and_mcp_methods_are_not_in_the_table(self) -> None:
        """0.5's removed methods are unknown, and MCP's notifications are not ours to route."""
        assert not REMOVED & set(INBOUND)
        assert not any(name.startswith(MCP_NOTIFICATIONS_PREFIX) for name in INBOUND)
        assert all(method_for(name) is None for name in REMOVED)
        assert method_for("host/command") is None

    def test_which_kinds_each_method_is_valid_as(self) -> None:
        """The hint is a notification only; channels/changed and incoming are both; the rest are requests."""
        kinds = {name: (entry.request is not None, entry.notification is not None) for name, entry in INBOUND.items()}
        assert kinds == {
            "ping": (True, False), "mcpl/manifestChanged": (False, True), "push/event": (True, False),
            "inference/request": (True, False), "model/info": (True, False),
            "channels/register": (True, False), "channels/changed": (True, True),
            "channels/list": (True, False), "channels/incoming": (True, True)}

    def test_inference_methods_are_gated_by_paths_offered_only_with_inference(self) -> None:
        """model/info and inference/request need paths offered only when [inference] is configured."""
        for method in ("model/info", "inference/request"):
            capability = INBOUND[method].capability
            assert capability in IMPLEMENTED
            assert capability not in offered_paths()
            assert capability in offered_paths(inference_configured=True)
