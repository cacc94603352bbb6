"""Refusals and quiet outcomes that say what happened, on the wire and in the log.

A malformed `channels/incoming` message names the field and the problem in
its result, as a malformed `push/event` does in its error data; a push
naming a channel this connection never registered is stored unscoped and
logged once per channel; a repeated push eventId is logged as a duplicate
with the original's item id.
"""

from __future__ import annotations

from structlog.testing import capture_logs

from ..builders import incoming, message, push, register
from ..harness import (
    SPLIT_MANIFEST,
    config_with,
    error_of,
    items_when,
    logged,
    record,
    result_of,
    scripted,
    stored_items,
    wait_for,
)
from ..memory_pair import memory_host

GRANT = ["pushEvents", "channels.register", "channels.incoming"]


class TestMalformedMessages:
    async def test_a_refused_message_names_field_and_problem_and_is_logged_once_per_request(self, tmp_path) -> None:
        """invalid_message carries code, field and problem; one warning names them; the good message is stored."""
        bad = {**message("d:1", "m-bad"), "content": [7]}
        steps = [register("d:1"), incoming(message("d:1", "m-good"), bad, {**message("d:1", "m-worse"), "tags": 3})]
        spec = scripted("bad", {"manifest": SPLIT_MANIFEST, "steps": steps}, tmp_path, grant=GRANT)
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "bad").done)
        results = result_of(record(tmp_path, "bad"), 1)["results"]
        assert results[0]["accepted"] is True
        assert results[1] == {"messageId": "m-bad", "accepted": False, "reason": "invalid_message", "code": -32602,
                              "field": "content[0]", "problem": "expected object, got int"}
        assert (results[2]["field"], results[2]["problem"]) == ("tags", "expected array, got int")
        (line,) = logged(logs, "mcpl.message_invalid", connector="bad")
        assert (line["messageId"], line["field"], line["problem"], line["refused"]) == (
            "m-bad", "content[0]", "expected object, got int", 2)
        assert [i.metadata["messageId"] for i in await stored_items(tmp_path)] == ["m-good"]

    async def test_a_malformed_push_names_field_and_problem_in_its_error_data(self, tmp_path) -> None:
        """A push without an eventId is -32602 whose data says which member and why."""
        params = push(feature_set="alerts")
        del params["eventId"]
        spec = scripted("badpush", {"manifest": SPLIT_MANIFEST, "steps": [{"request": "push/event", "params": params}]},
                        tmp_path, grant=GRANT)
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "badpush").done)
        error = error_of(record(tmp_path, "badpush"), 0)
        assert error["code"] == -32602
        assert error["data"] == {"field": "eventId", "problem": "required member missing"}


class TestPushOutcomes:
    async def test_a_push_naming_an_unregistered_channel_is_logged_once_per_channel(self, tmp_path) -> None:
        """Stored unscoped, with one warning per (connector, channel) however many pushes name it."""
        steps = [register("d:1"),
                 *[{"request": "push/event",
                    "params": push(f"e-{n}", feature_set="alerts", origin={"mcplChannelId": channel})}
                   for n, channel in enumerate(["d:gone", "d:gone", "d:other", "d:1"])]]
        spec = scripted("lost", {"manifest": SPLIT_MANIFEST, "steps": steps}, tmp_path, grant=GRANT)
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "lost").done)
                items = await items_when(tmp_path, 4)
        warned = logged(logs, "mcpl.push_channel_unregistered", connector="lost")
        assert sorted(e["channel"] for e in warned) == ["d:gone", "d:other"]
        assert [i.metadata["channelId"] for i in items] == [None, None, None, "d:1"]

    async def test_a_repeated_event_id_is_logged_as_a_duplicate_of_the_original_item(self, tmp_path) -> None:
        """The first push logs mcpl.push with its item id; the repeat logs mcpl.push_duplicate naming that id."""
        steps = [{"request": "push/event", "params": push("e-1", feature_set="alerts")},
                 {"request": "push/event", "params": push("e-1", feature_set="alerts")}]
        spec = scripted("dup", {"manifest": SPLIT_MANIFEST, "steps": steps}, tmp_path, grant=GRANT)
        with capture_logs() as logs:
            async with memory_host(config_with(tmp_path, spec)):
                await wait_for(lambda: record(tmp_path, "dup").done)
        (stored,) = logged(logs, "mcpl.push", connector="dup", eventId="e-1")
        (repeat,) = logged(logs, "mcpl.push_duplicate", connector="dup", eventId="e-1")
        (item,) = await stored_items(tmp_path)
        assert stored["item"] == repeat["original"] == item.id
        rec = record(tmp_path, "dup")
        assert result_of(rec, 0) == result_of(rec, 1)
