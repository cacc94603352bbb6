"""Event tags on the wire: never admission, the core closure, producer implies only when accepted (SPEC §16).

docs/mcpl-checklist.md items 27-29 (a changed ontology cancelling the
acceptance is in test_manifest_wire). Stored tags are read from
`metadata.tags` of the items in the real store.
"""

from __future__ import annotations

from typing import Any

from ..builders import incoming, message, push, register, texts
from ..harness import SPLIT_MANIFEST, config_with, error_of, items_when, record, result_of, scripted, wait_for
from ..memory_pair import memory_host

GRANT = ["pushEvents", "channels.register", "channels.incoming"]
ADDRESSING = ["chat:dm", "chat:mention", "chat:addressed", "mcpl:trusted", "mcpl:grant=*"]

#: A producer ontology whose own edge leads, through a core edge, to chat:addressed.
ONTOLOGY_MANIFEST: dict[str, Any] = {
    **SPLIT_MANIFEST,
    "featureSets": {**SPLIT_MANIFEST["featureSets"],
                    "chat": {**SPLIT_MANIFEST["featureSets"]["chat"],
                             "tagOntology": {"tags": {"x:urgent": {"implies": ["chat:mention"],
                                                                   "suggestedTreatment": "immediate"}}}}},
}


def stored_tags(items: list[Any]) -> dict[str, list[str]]:
    """Each item's stored tags, keyed by its message body."""
    return {texts(item.content)[-1]: item.metadata["tags"] for item in items}


class TestTagsNeverAdmit:
    async def test_addressing_tags_open_no_channel_grant_or_feature_set(self, tmp_path) -> None:
        """Tagged messages and pushes are refused exactly as untagged ones would be."""
        steps = [incoming(message("d:never", "m-1", tags=ADDRESSING)),
                 {"request": "push/event", "params": push(feature_set="nope", tags=ADDRESSING)},
                 {"request": "channels/register", "params": {"channels": [{"id": "", "tags": ADDRESSING}]}}]
        tagged = scripted("tagged", {"manifest": SPLIT_MANIFEST, "steps": steps}, tmp_path, grant=GRANT)
        ungranted = scripted("ungranted", {"manifest": SPLIT_MANIFEST, "steps": [
            {"request": "push/event", "params": push(feature_set="alerts", tags=ADDRESSING)}]},
            tmp_path, grant=["channels.register"])
        async with memory_host(config_with(tmp_path, tagged, ungranted)):
            await wait_for(lambda: record(tmp_path, "tagged").done and record(tmp_path, "ungranted").done)
        rec = record(tmp_path, "tagged")
        assert result_of(rec, 0)["results"][0]["code"] == -32023
        assert error_of(rec, 1)["code"] == -32003
        assert result_of(rec, 2)["results"][0]["accepted"] is False
        assert error_of(record(tmp_path, "ungranted"), 0)["data"] == {"capability": "pushEvents"}
        updates = [m for m in rec.received if m.get("method") == "featureSets/update"]
        assert len(updates) == 1


class TestCoreClosure:
    async def test_the_core_edges_expand_and_addressed_removes_ambient(self, tmp_path) -> None:
        """dm, mention and reply add their core tags; chat:ambient goes once chat:addressed is present."""
        cases = {
            "dm": ["chat:dm", "chat:ambient", "chat:dm", "x:y", "bare"],
            "reply": ["chat:reply", "chat:ambient"],
            "unnamespaced": ["mention", "dm", "chat:ambient"],
            "ambient": ["chat:ambient", "chat:group"],
        }
        messages = [message("d:1", f"m-{name}", name, tags=tags) for name, tags in cases.items()]
        steps = [register("d:1"), incoming(*messages),
                 {"request": "push/event", "params": push(feature_set="alerts", body="pushed",
                                                          tags=["chat:mention", "chat:ambient"])}]
        async with memory_host(config_with(tmp_path, scripted("core", {"manifest": SPLIT_MANIFEST, "steps": steps},
                                                               tmp_path, grant=GRANT))):
            await wait_for(lambda: record(tmp_path, "core").done)
            items = await items_when(tmp_path, 5)
        assert stored_tags(items) == {
            "dm": ["bare", "chat:addressed", "chat:dm", "chat:private", "x:y"],
            "reply": ["chat:addressed", "chat:reply"],
            "unnamespaced": ["chat:ambient", "dm", "mention"],
            "ambient": ["chat:ambient", "chat:group"],
            "pushed": ["chat:addressed", "chat:mention"],
        }


class TestProducerImplies:
    async def test_producer_edges_apply_only_with_the_operators_acceptance(self, tmp_path) -> None:
        """x:urgent → chat:mention is followed only under accept_tag_implications, then the core closure runs."""
        def connector(name: str, accept: bool):
            steps = [register(f"{name}:1"),
                     incoming(message(f"{name}:1", "m-1", name, tags=["x:urgent", "chat:ambient"]))]
            return scripted(name, {"manifest": ONTOLOGY_MANIFEST, "steps": steps}, tmp_path, grant=GRANT,
                            accept_tag_implications=accept)

        async with memory_host(config_with(tmp_path, connector("accepted", True), connector("declined", False))):
            await wait_for(lambda: record(tmp_path, "accepted").done and record(tmp_path, "declined").done)
            items = await items_when(tmp_path, 2)
        assert stored_tags(items) == {"accepted": ["chat:addressed", "chat:mention", "x:urgent"],
                                      "declined": ["chat:ambient", "x:urgent"]}
