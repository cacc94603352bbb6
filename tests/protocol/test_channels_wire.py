"""Channels on the wire: per-descriptor registration, changes, incoming at receipt, open and list (SPEC §14).

SPEC §14, with the channel error codes -32017,
-32023 (per message, in `results`) and -32024 (the connector's answer to
channels/open, logged by the host). Narrowing patterns are the connector's
`channels` globs.
"""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from ..builders import descriptor, incoming, message, register, texts
from ..harness import (
    CHAT_GRANT,
    CHAT_MANIFEST,
    HINT,
    change_grant,
    config_with,
    error_of,
    items_when,
    logged,
    nudge,
    record,
    result_of,
    scripted,
    wait_for,
)
from ..memory_pair import memory_connected, memory_host


def chat(tmp_path, name: str, steps: list[dict[str, Any]], **fields: Any):
    script = {"manifest": CHAT_MANIFEST, "steps": steps, **fields.pop("script", {})}
    return scripted(name, script, tmp_path, grant=fields.pop("grant", CHAT_GRANT), **fields)


def outcomes(results: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r.get("id", r.get("messageId")), r["accepted"], r.get("reason"), r.get("code")) for r in results]


class TestRegister:
    async def test_each_descriptor_is_judged_alone_and_answered_in_order(self, tmp_path) -> None:
        """A mixed batch gets one result per descriptor; the refused ones confer nothing later."""
        batch = [descriptor("disc:g1:a"), descriptor("disc:g2:x"), {"type": "disc", "label": "no id"},
                 descriptor("disc:g1:sideways", direction="sideways"), "not an object",
                 descriptor("disc:g1:a", label="#again"), descriptor("disc:g1:b", direction="outbound"),
                 descriptor("disc:g1:c", label=7)]
        steps = [{"request": "channels/register", "params": {"channels": batch}},
                 {"request": "channels/list"},
                 incoming(message("disc:g1:a", "m-a"), message("disc:g2:x", "m-x"),
                          message("disc:g1:b", "m-b"), message("disc:g1:sideways", "m-s"))]
        spec = chat(tmp_path, "reg", steps, channels=["disc:g1:*"])
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "reg").done)
        rec = record(tmp_path, "reg")
        assert outcomes(result_of(rec, 0)["results"]) == [
            ("disc:g1:a", True, None, None), ("disc:g2:x", False, "channel_not_permitted", None),
            (None, False, "invalid_descriptor", None), ("disc:g1:sideways", False, "invalid_descriptor", None),
            (None, False, "invalid_descriptor", None), ("disc:g1:a", False, "duplicate_id", None),
            ("disc:g1:b", True, None, None), ("disc:g1:c", False, "invalid_descriptor", None)]
        assert [c["id"] for c in result_of(rec, 1)["channels"]] == ["disc:g1:a", "disc:g1:b"]
        assert outcomes(result_of(rec, 2)["results"])[1:] == [
            ("m-x", False, "unknown_channel", -32023), ("m-b", False, "channel_not_permitted", -32017),
            ("m-s", False, "unknown_channel", -32023)]
        assert result_of(rec, 2)["results"][0]["accepted"] is True

    async def test_channels_list_answers_with_this_connections_channels(self, tmp_path) -> None:
        """Inbound channels/list returns the accepted descriptors of the asking connection only."""
        first = chat(tmp_path, "first", [register("x:1", "x:2"), {"request": "channels/list"}])
        second = chat(tmp_path, "second", [register("y:1"), {"request": "channels/list"}])
        async with memory_host(config_with(tmp_path, first, second)):
            await wait_for(lambda: record(tmp_path, "first").done and record(tmp_path, "second").done)
        assert result_of(record(tmp_path, "first"), 1) == {"channels": [descriptor("x:1"), descriptor("x:2")]}
        assert result_of(record(tmp_path, "second"), 1) == {"channels": [descriptor("y:1")]}


class TestChanged:
    async def test_a_partly_refused_notification_is_filtered_and_logged(self, tmp_path) -> None:
        """channels/changed as a Notification: allowed items apply, refused ones are dropped with a diagnostic each."""
        change = {"added": [descriptor("disc:g1:c"), descriptor("disc:g9:x")], "removed": ["disc:g1:a"],
                  "updated": [descriptor("disc:g1:zzz")]}
        steps = [register("disc:g1:a"), {"notify": "channels/changed", "params": change},
                 incoming(message("disc:g1:c", "m-c"), message("disc:g9:x", "m-x"), message("disc:g1:a", "m-a"))]
        spec = chat(tmp_path, "chg", steps, channels=["disc:g1:*"])
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "chg").done)
        assert outcomes(result_of(record(tmp_path, "chg"), 2)["results"])[1:] == [
            ("m-x", False, "unknown_channel", -32023), ("m-a", False, "unknown_channel", -32023)]
        refused = logged(logs, "channels.descriptor_refused", connector="chg")
        assert sorted((r["channel"], r["reason"]) for r in refused) == [
            ("disc:g1:zzz", "unknown_channel"), ("disc:g9:x", "channel_not_permitted")]

    async def test_the_request_form_answers_item_by_item(self, tmp_path) -> None:
        """channels/changed as a Request returns one result per added, updated and removed item."""
        change = {"added": [descriptor("disc:g1:c"), descriptor("disc:g9:x")], "removed": ["disc:g1:a"],
                  "updated": [descriptor("disc:g1:b", label="#renamed")]}
        steps = [register("disc:g1:a", "disc:g1:b"), {"request": "channels/changed", "params": change},
                 {"request": "channels/list"}]
        async with memory_host(config_with(tmp_path, chat(tmp_path, "chgr", steps, channels=["disc:g1:*"]))):
            await wait_for(lambda: record(tmp_path, "chgr").done)
        rec = record(tmp_path, "chgr")
        assert outcomes(result_of(rec, 1)["results"]) == [
            ("disc:g1:c", True, None, None), ("disc:g9:x", False, "channel_not_permitted", None),
            ("disc:g1:b", True, None, None), ("disc:g1:a", True, None, None)]
        assert {c["id"]: c["label"] for c in result_of(rec, 2)["channels"]} == {"disc:g1:b": "#renamed",
                                                                                "disc:g1:c": "#c"}


class TestIncoming:
    async def test_a_channel_id_belongs_to_the_connection_that_registered_it(self, tmp_path) -> None:
        """Another connector's registered id is unknown here (-32023) until this connector registers its own."""
        owner = chat(tmp_path, "owner", [register("shared:room"), incoming(message("shared:room", "m-1", "owner's"))])
        other = chat(tmp_path, "other", [incoming(message("shared:room", "m-2", "claimed")),
                                         register("shared:room"), incoming(message("shared:room", "m-3", "own"))])
        async with memory_host(config_with(tmp_path, owner, other)):
            await wait_for(lambda: record(tmp_path, "owner").done and record(tmp_path, "other").done)
            items = await items_when(tmp_path, 2)
        assert outcomes(result_of(record(tmp_path, "other"), 0)["results"]) == [
            ("m-2", False, "unknown_channel", -32023)]
        assert sorted((i.metadata["serverId"], texts(i.content)[-1]) for i in items) == [
            ("other", "own"), ("owner", "owner's")]

    async def test_each_message_is_judged_alone(self, tmp_path) -> None:
        """A batch mixing good, unregistered, outbound-only and malformed messages is answered per message."""
        steps = [{"request": "channels/register", "params": {"channels": [
                     descriptor("d:in"), descriptor("d:out", direction="outbound"),
                     descriptor("d:inbound", direction="inbound")]}},
                 incoming(message("d:in", "m-1"), message("d:nowhere", "m-2"), message("d:out", "m-3"),
                          {"channelId": "d:in", "messageId": "m-4"}, message("d:inbound", "m-5"))]
        async with memory_host(config_with(tmp_path, chat(tmp_path, "batch", steps))):
            await wait_for(lambda: record(tmp_path, "batch").done)
            await items_when(tmp_path, 2)
        results = result_of(record(tmp_path, "batch"), 1)["results"]
        assert [(r["messageId"], r["accepted"], r.get("code")) for r in results] == [
            ("m-1", True, None), ("m-2", False, -32023), ("m-3", False, -32017), ("m-4", False, -32602),
            ("m-5", True, None)]

    async def test_incoming_needs_channels_incoming_in_the_grant_at_receipt(self, tmp_path) -> None:
        """With channels.incoming not granted even a registered channel's messages get -32002."""
        steps = [register("d:1"), incoming(message("d:1"))]
        spec = chat(tmp_path, "noin", steps, grant=["channels.register"])
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "noin").done)
        assert error_of(record(tmp_path, "noin"), 1) == {"code": -32002, "message": "Capability denied",
                                                          "data": {"capability": "channels.incoming"}}

    async def test_a_revocation_reaches_the_next_message(self, tmp_path) -> None:
        """After channels.incoming is revoked, a message on a channel registered before is refused -32002."""
        steps = [register("d:1"), {"wait": "featureSets/update", "count": 2}, incoming(message("d:1"))]
        spec = chat(tmp_path, "revoked", steps)
        async with memory_connected(spec, tmp_path) as connection:
            await wait_for(lambda: 0 in record(tmp_path, "revoked").answers())
            await change_grant(connection, connection.grant - {"channels.incoming"})
            await wait_for(lambda: record(tmp_path, "revoked").done)
        assert error_of(record(tmp_path, "revoked"), 2)["data"] == {"capability": "channels.incoming"}

    async def test_channels_registered_under_a_revoked_register_grant_lose_their_authority(self, tmp_path) -> None:
        """Revoking channels.register drops the channels it admitted: their messages become unknown (-32023)."""
        steps = [register("d:1"), {"wait": "featureSets/update", "count": 2}, incoming(message("d:1"))]
        spec = chat(tmp_path, "unreg", steps)
        async with memory_connected(spec, tmp_path) as connection:
            await wait_for(lambda: 0 in record(tmp_path, "unreg").answers())
            await change_grant(connection, connection.grant - {"channels.register"})
            await wait_for(lambda: record(tmp_path, "unreg").done)
        assert outcomes(result_of(record(tmp_path, "unreg"), 2)["results"]) == [("m-1", False, "unknown_channel",
                                                                                 -32023)]

    async def test_incoming_as_a_notification_is_validated_the_same_and_flagged(self, tmp_path) -> None:
        """A channels/incoming Notification stores only admissible messages and logs a conformance defect."""
        steps = [register("d:1"), {"notify": "channels/incoming",
                                   "params": {"messages": [message("d:1", "m-1", "kept"), message("d:2", "m-2")]}},
                 {"request": "ping"}]
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, chat(tmp_path, "notif", steps))):
                await wait_for(lambda: record(tmp_path, "notif").done)
                (item,) = await items_when(tmp_path, 1)
        assert texts(item.content)[-1] == "kept"
        assert logged(logs, "connector.defect", connector="notif")
        replies = [m for m in record(tmp_path, "notif").received if "id" in m and "method" not in m]
        assert len(replies) == 2  # the register and the ping; the notification got none


class TestOpen:
    OPENING = [descriptor("d:closed", initiallyOpen=False), descriptor("d:plain"),
               descriptor("d:open", initiallyOpen=True, metadata={"topic": "x"})]

    async def test_channels_open_goes_to_initially_open_descriptors_only(self, tmp_path) -> None:
        """With channels.lifecycle granted only the initiallyOpen descriptor is opened; without it none is."""
        handlers = {"channels/open": {"result": {"channel": descriptor("d:open")}}}
        steps = [{"request": "channels/register", "params": {"channels": self.OPENING}},
                 HINT, {"wait": "mcpl/manifest"}]
        script = {"handlers": {**handlers, "mcpl/manifest": {"result": CHAT_MANIFEST}}}
        granted = chat(tmp_path, "granted", steps, script=script)
        ungranted = chat(tmp_path, "ungranted", steps, grant=["channels.register", "channels.incoming"], script=script)
        async with memory_host(config_with(tmp_path, granted, ungranted)):
            await wait_for(lambda: record(tmp_path, "granted").done and record(tmp_path, "ungranted").done)
        opens = [m for m in record(tmp_path, "granted").received if m.get("method") == "channels/open"]
        assert [o["params"] for o in opens] == [{"type": "disc", "address": {"channel": "d:open"},
                                                 "metadata": {"topic": "x"}}]
        assert "channels/open" not in record(tmp_path, "ungranted").methods_received()

    async def test_an_open_failure_is_logged_and_the_connector_goes_on(self, tmp_path) -> None:
        """A -32024 answer to channels/open is logged; the connector's later messages are still served."""
        handlers = {"channels/open": {"error": {"code": -32024, "message": "Opening the channel failed"}}}
        steps = [{"request": "channels/register", "params": {"channels": [descriptor("d:open", initiallyOpen=True)]}},
                 {"wait": "channels/open"}, incoming(message("d:open", "m-1", "after"))]
        with capture_logs() as logs:
            spec = chat(tmp_path, "fails", steps, script={"handlers": handlers})
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "fails").done)
                await wait_for(lambda: logged(logs, "connector.job_failed", connector="fails"))
                (item,) = await items_when(tmp_path, 1)
        assert texts(item.content)[-1] == "after"
        assert "-32024" in logged(logs, "connector.job_failed", connector="fails")[0]["error"]

    async def test_a_descriptor_returned_by_open_is_authorized_like_a_registration(self, tmp_path) -> None:
        """channels/open answering with a channel outside the narrowing patterns does not register it."""
        handlers = {"channels/open": {"result": {"channel": descriptor("evil:elsewhere")}}}
        steps = [{"request": "channels/register", "params": {"channels": [descriptor("d:open", initiallyOpen=True)]}},
                 {"wait": "channels/open"}]
        spec = chat(tmp_path, "opened", steps, channels=["d:*"], script={"handlers": handlers})
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: logged(logs, "channels.opened", connector="opened"))
                await wait_for(lambda: record(tmp_path, "opened").done)
        assert logged(logs, "channels.descriptor_refused", connector="opened", channel="evil:elsewhere",
                      reason="channel_not_permitted")


class TestOpenLater:
    """channels/open runs as a background job, after whatever changed since the registration."""

    BLOCKED = {"mcpl/manifest": "ignore", "channels/open": {"result": {"channel": descriptor("d:new")}}}

    def blocked(self, tmp_path, name: str, steps: list[dict[str, Any]]):
        """A connector whose first hint parks the job queue on a manifest fetch it never answers."""
        return chat(tmp_path, name, [HINT, {"wait": "mcpl/manifest"}, *steps], request_timeout_s=1.0,
                    script={"handlers": self.BLOCKED})

    async def test_a_channel_revoked_before_its_open_job_is_not_opened(self, tmp_path) -> None:
        """If channels.lifecycle is revoked while the open waits in the queue, no channels/open goes out."""
        steps = [{"request": "channels/register", "params": {"channels": [descriptor("d:1", initiallyOpen=True)]}}]
        with capture_logs() as logs:
            async with memory_connected(self.blocked(tmp_path, "revoked", steps), tmp_path) as connection:
                await wait_for(lambda: 2 in record(tmp_path, "revoked").answers())
                await change_grant(connection, connection.grant - {"channels.lifecycle"})
                await wait_for(lambda: logged(logs, "connector.job_skipped", job="open"))
        assert "channels/open" not in record(tmp_path, "revoked").methods_received()

    async def test_a_channel_removed_before_its_open_job_is_not_opened(self, tmp_path) -> None:
        """If the connector removes the channel while the open waits in the queue, no channels/open goes out."""
        steps = [{"request": "channels/register", "params": {"channels": [descriptor("d:1", initiallyOpen=True)]}},
                 {"request": "channels/changed", "params": {"removed": ["d:1"]}}]
        with capture_logs() as logs:
            async with memory_connected(self.blocked(tmp_path, "removed", steps), tmp_path):
                await wait_for(lambda: logged(logs, "connector.job_skipped", job="open"))
        assert "channels/open" not in record(tmp_path, "removed").methods_received()

    async def test_a_descriptor_returned_by_open_needs_channels_register_now(self, tmp_path) -> None:
        """Without channels.register at the answer, the descriptor channels/open returns is not registered."""
        steps = [register("d:1"), {"wait": "test/go"}, incoming(message("d:new"))]
        spec = chat(tmp_path, "opener", steps, script={"handlers": self.BLOCKED})
        async with memory_connected(spec, tmp_path) as connection:
            await wait_for(lambda: 0 in record(tmp_path, "opener").answers())
            channel = connection.registry.get("d:1")
            await change_grant(connection, connection.grant - {"channels.register"})
            await connection.open_channel(channel)
            await nudge(connection, "test/go")
            await wait_for(lambda: record(tmp_path, "opener").done)
        assert outcomes(result_of(record(tmp_path, "opener"), 2)["results"]) == [("m-1", False, "unknown_channel",
                                                                                  -32023)]
