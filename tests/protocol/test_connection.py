"""McplConnection's bounded state keyed by connector-chosen strings: once-only warnings and the channel registry."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import msgspec
import pytest
import structlog
from msgspec import Raw
from structlog.testing import capture_logs

from mcplhost.config import ConnectorConfig
from mcplhost.logs import LINES_PER_WINDOW
from mcplhost.protocol import connection as connection_module
from mcplhost.protocol import errors
from mcplhost.protocol.channels import CHANNEL_LIMIT, ChannelRegistry
from mcplhost.protocol.connection import MAX_WARNED_KEYS, UNKNOWN_METHOD, McplConnection, Mode

from ..builders import descriptor
from ..harness import gone_session, logged


@pytest.fixture
async def ready() -> AsyncIterator[Callable[[set[str]], McplConnection]]:
    """Connections put in READY by hand (these rules need no connector on the other end), closed afterwards."""
    made: list[McplConnection] = []

    def make(grant: set[str]) -> McplConnection:
        spec = ConnectorConfig(name="c", command=["unused"])
        conn = McplConnection(spec, gone_session(), intake=None,  # type: ignore[arg-type]
                              log=structlog.get_logger().bind(connector="c"))
        conn.mode, conn.grant = Mode.READY, frozenset(grant)
        made.append(conn)
        return conn

    yield make
    for conn in made:
        conn.close_jobs()
        with anyio.fail_after(5):
            await conn.run_background()  # no job is queued: it ends at once, closing the queue as a life's end does
            await conn.session.run()  # its peer is gone: it ends at once and closes its streams


def params(value: Any) -> Raw:
    return Raw(msgspec.json.encode(value))


class TestWarnOnce:
    def test_each_key_warns_once(self, ready) -> None:
        """The same key never logs twice; a different key does."""
        conn = ready(set())
        with capture_logs() as logs:
            for key in ("a", "a", "b"):
                conn.warn_once(key, "test.warning", which=key)
        assert [e["which"] for e in logged(logs, "test.warning")] == ["a", "b"]

    def test_the_remembered_keys_are_capped_and_the_cap_is_logged_once(self, ready) -> None:
        """Past MAX_WARNED_KEYS distinct keys nothing more is remembered or logged, except one line saying so.

        Below the cap each key still passes the per-event limiter: its allowance is logged, the rest counted.
        """
        conn = ready(set())
        with capture_logs() as logs:
            for n in range(MAX_WARNED_KEYS + 50):
                conn.warn_once(f"notification:junk/{n}", "connector.unknown_notification", method=f"junk/{n}")
            conn.limited.close()
        assert len(logged(logs, "connector.unknown_notification")) == LINES_PER_WINDOW
        assert [e["count"] for e in logged(logs, "log.suppressed", suppressed_event="connector.unknown_notification")
                ] == [MAX_WARNED_KEYS - LINES_PER_WINDOW]
        assert len(logged(logs, "connector.warnings_capped", limit=MAX_WARNED_KEYS)) == 1
        assert conn.statistics()["warned_keys"] == MAX_WARNED_KEYS

    async def test_unknown_notifications_with_ever_new_names_stay_bounded(self, ready) -> None:
        """A connector inventing notification names cannot grow the warned set without bound."""
        conn = ready(set())
        with capture_logs():
            for n in range(MAX_WARNED_KEYS * 2):
                await conn.on_notification(f"junk/{n}", params({}))
        assert conn.statistics()["warned_keys"] == MAX_WARNED_KEYS


class TestRefusalCounts:
    async def test_refusals_are_counted_per_method_and_code_beyond_what_is_logged(self, ready) -> None:
        """statistics() has every refusal, keyed by method and code; an unknown method's name is not a key."""
        conn = ready(set())
        with capture_logs() as logs:
            for n in range(3 * LINES_PER_WINDOW):
                with pytest.raises(errors.ConnectorProtocolError):
                    await conn.on_request("channels/register", params({"channels": []}))
                with pytest.raises(errors.ConnectorProtocolError):
                    await conn.on_request(f"made/up/{n}", params({}))
                await conn.on_notification("channels/incoming", params({"messages": []}))
                await conn.on_notification(f"made/up/{n}", params({}))
            conn.limited.close()
        stats = conn.statistics()
        assert stats["refused"] == {f"channels/register {errors.CAPABILITY_DENIED}": 3 * LINES_PER_WINDOW,
                                    f"{UNKNOWN_METHOD} {errors.METHOD_NOT_FOUND}": 3 * LINES_PER_WINDOW}
        assert stats["notifications_refused"] == {f"channels/incoming {errors.CAPABILITY_DENIED}": 3 * LINES_PER_WINDOW}
        assert stats["notifications_unknown"] == 3 * LINES_PER_WINDOW
        assert len(logged(logs, "mcpl.refused")) == LINES_PER_WINDOW  # both methods share the event's allowance
        assert stats["log_suppressed"]["mcpl.refused"] == 6 * LINES_PER_WINDOW - LINES_PER_WINDOW
        summaries = {e["suppressed_event"]: e["count"] for e in logged(logs, "log.suppressed")}
        assert summaries == stats["log_suppressed"]


class TestChannelLimit:
    async def test_registrations_over_the_cap_are_refused_itemized_and_logged_once(self, ready) -> None:
        """Over the registry's limit each new descriptor gets channel_limit, and the cap is logged once."""
        conn = ready({"channels.register"})
        conn.registry = ChannelRegistry(limit=3)
        with capture_logs() as logs:
            first = await conn.on_request("channels/register",
                                          params({"channels": [descriptor(f"d:{n}") for n in range(5)]}))
            second = await conn.on_request("channels/register", params({"channels": [descriptor("d:9")]}))
        assert [r.get("reason") for r in first["results"]] == [None, None, None, CHANNEL_LIMIT, CHANNEL_LIMIT]
        assert second["results"] == [{"id": "d:9", "accepted": False, "reason": CHANNEL_LIMIT}]
        assert len(logged(logs, "channels.limit_reached", limit=3)) == 1
        assert len(conn.registry.channels()) == 3

    def test_every_connection_gets_the_default_cap(self, ready) -> None:
        """The registry a connection builds is bounded by MAX_CHANNELS."""
        assert ready(set()).registry.limit == connection_module.ChannelRegistry().limit
