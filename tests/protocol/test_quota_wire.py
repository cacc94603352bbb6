"""Per-connector quotas on the wire (docs/operations.md#quotas): the scripted connector in memory, a real store.

The hour itself (restarts, sliding, spells) is tested in process (tests/test_ingest_quotas.py); this
checks what the connector is answered and that a restarted host still refuses.
"""

from __future__ import annotations

from structlog.testing import capture_logs

from ..builders import incoming, message, push, register
from ..harness import SPLIT_MANIFEST, config_with, error_of, logged, record, result_of, scripted, stored_items, wait_for
from ..memory_pair import memory_host

GRANT = ["pushEvents", "channels.register", "channels.incoming"]
ROOM = "disc:g1:room"


def chatty(tmp_path, name: str, steps: list, **fields):
    return scripted(name, {"manifest": SPLIT_MANIFEST, "steps": steps}, tmp_path, grant=GRANT,
                    max_items_per_hour=3, **fields)


async def test_past_the_items_quota_messages_are_refused_itemised_and_pushes_with_an_error(tmp_path) -> None:
    """max_items_per_hour = 3: the fourth message is refused with reason quota, so is a push; a restart still refuses."""
    steps = [register(ROOM),
             incoming(*(message(ROOM, f"m-{n}") for n in range(1, 5))),
             {"request": "push/event", "params": push("e-1", feature_set="alerts")}]
    spec = chatty(tmp_path, "disc", steps)
    with capture_logs() as logs:
        async with memory_host(config_with(tmp_path, spec)):
            await wait_for(lambda: record(tmp_path, "disc").done)
    rec = record(tmp_path, "disc")
    results = result_of(rec, 1)["results"]
    assert [r["accepted"] for r in results] == [True, True, True, False]
    refused = results[3]
    assert (refused["messageId"], refused["reason"], refused["code"], refused["quota"]) == ("m-4", "quota", -32603,
                                                                                           "items")
    assert 0 < refused["retryAfterMs"] <= 3_600_000
    error = error_of(rec, 2)
    assert error["code"] == -32603 and error["data"]["reason"] == "quota" and error["data"]["quota"] == "items"
    assert len(logged(logs, "connector.quota_reached", connector="disc", quota="items")) == 1
    assert len(await stored_items(tmp_path)) == 3

    (tmp_path / "disc.jsonl").unlink()  # a new host, a new process life, the same store
    async with memory_host(config_with(tmp_path, chatty(tmp_path, "disc", [register(ROOM),
                                                                          incoming(message(ROOM, "m-5"))]))):
        await wait_for(lambda: record(tmp_path, "disc").done)
    (result,) = result_of(record(tmp_path, "disc"), 1)["results"]
    assert (result["accepted"], result["reason"]) == (False, "quota")
    assert len(await stored_items(tmp_path)) == 3
