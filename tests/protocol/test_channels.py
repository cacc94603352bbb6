"""Tests for mcplhost/protocol/channels.py: descriptors judged one by one, narrowing globs (SPEC §14; docs/connectors.md §5)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.protocol.channels import (
    CHANNEL_LIMIT,
    MAX_CHANNELS,
    Channel,
    ChannelRegistry,
    parse_descriptor,
    permitted,
)


def desc(channel_id: Any, **extra: Any) -> dict[str, Any]:
    return {"id": channel_id, "type": "disc", "label": f"#{channel_id}", "direction": "bidirectional",
            "address": {}, **extra}


ids = st.sampled_from(["a:1", "a:2", "b:1", "a:1:x", "", "A:1"])
descriptors = st.one_of(
    ids.map(desc),
    st.builds(lambda i, d: desc(i, direction=d), ids, st.sampled_from(["inbound", "outbound", "sideways", 3])),
    st.builds(lambda i: {"id": i}, ids),
    st.sampled_from([None, "a:1", 7, [], {"label": "no id"}]),
)


class TestParseDescriptor:
    def test_a_well_formed_descriptor_becomes_a_channel(self) -> None:
        """id, type, label, direction, address and metadata are kept."""
        channel = parse_descriptor(desc("a:1", metadata={"k": 1}))
        assert channel == Channel(id="a:1", type="disc", label="#a:1", direction="bidirectional", address={},
                                  metadata={"k": 1})

    def test_unknown_members_are_tolerated_and_initially_open_is_kept(self) -> None:
        """Deployed servers add initiallyOpen and capabilities; both are accepted."""
        channel = parse_descriptor(desc("a:1", initiallyOpen=True, capabilities={"typing": True}))
        assert isinstance(channel, Channel) and channel.initiallyOpen is True

    def test_malformed_descriptors_are_named_invalid(self) -> None:
        """No id, an empty id, a non-object, a wrong type or an unknown direction are invalid_descriptor."""
        for raw in ({"type": "disc"}, desc(""), "a:1", None, desc("a:1", label=7), desc(5),
                    desc("a:1", direction="sideways")):
            assert parse_descriptor(raw) == "invalid_descriptor", raw

    def test_the_direction_defaults_to_bidirectional_and_outbound_does_not_receive(self) -> None:
        """Only an outbound-only channel refuses incoming messages."""
        assert parse_descriptor({"id": "a:1"}).receives is True
        assert parse_descriptor(desc("a:1", direction="inbound")).receives is True
        assert parse_descriptor(desc("a:1", direction="outbound")).receives is False

    def test_descriptor_omits_absent_members(self) -> None:
        """channels/list returns the members the connector sent, without nulls for the rest."""
        assert parse_descriptor({"id": "a:1"}).descriptor() == {"id": "a:1", "direction": "bidirectional"}


class TestPermitted:
    def test_no_patterns_means_any_id(self) -> None:
        """Without a `channels` setting every id is inside the narrowing."""
        assert permitted("anything:at:all", None)

    def test_a_glob_matches_the_whole_id_and_star_crosses_separators(self) -> None:
        """`disc:g1:*` admits every id under `disc:g1:` and nothing that merely shares a prefix."""
        patterns = ["disc:g1:*"]
        assert permitted("disc:g1:room", patterns)
        assert permitted("disc:g1:room:thread", patterns)
        assert not permitted("disc:g10:room", patterns)
        assert not permitted("DISC:g1:room", patterns)
        assert not permitted("xdisc:g1:room", patterns)

    def test_an_empty_pattern_list_admits_nothing(self) -> None:
        """`channels = []` is a narrowing to no channel at all, not "no narrowing"."""
        assert not permitted("disc:g1:room", [])


class TestRegistry:
    def test_results_are_one_per_descriptor_in_order_with_reasons(self) -> None:
        """A mixed batch is answered item by item; only the allowed descriptors are registered."""
        registry = ChannelRegistry(["a:*"])
        results, accepted = registry.add([desc("a:1"), desc("b:1"), "junk", desc("a:1"), desc("a:2")])
        assert results == [{"id": "a:1", "accepted": True},
                           {"id": "b:1", "accepted": False, "reason": "channel_not_permitted"},
                           {"id": None, "accepted": False, "reason": "invalid_descriptor"},
                           {"id": "a:1", "accepted": False, "reason": "duplicate_id"},
                           {"id": "a:2", "accepted": True}]
        assert [c.id for c in accepted] == ["a:1", "a:2"]
        assert [c.id for c in registry.channels()] == ["a:1", "a:2"]

    def test_registering_an_id_again_in_a_later_batch_replaces_it(self) -> None:
        """The latest registered descriptor is the one in force (its label is used at receipt)."""
        registry = ChannelRegistry()
        registry.add([desc("a:1")])
        registry.add([desc("a:1", label="#renamed")])
        assert registry.get("a:1").label == "#renamed"

    def test_an_update_must_name_a_registered_channel(self) -> None:
        """`updated` descriptors for unknown ids are refused as unknown_channel."""
        registry = ChannelRegistry()
        registry.add([desc("a:1")])
        results, _ = registry.add([desc("a:1", label="#x"), desc("a:9")], must_exist=True)
        assert results == [{"id": "a:1", "accepted": True},
                           {"id": "a:9", "accepted": False, "reason": "unknown_channel"}]
        assert registry.get("a:9") is None

    def test_removals_always_succeed_and_are_echoed(self) -> None:
        """Removing only narrows: known, unknown and repeated ids are echoed as accepted; a non-string is refused."""
        registry = ChannelRegistry()
        registry.add([desc("a:1")])
        assert registry.remove(["a:1", "a:1", "never", 3]) == [
            {"id": "a:1", "accepted": True}, {"id": "a:1", "accepted": True}, {"id": "never", "accepted": True},
            {"id": None, "accepted": False, "reason": "invalid_descriptor"}]
        assert registry.channels() == []

    def test_clear_forgets_every_channel(self) -> None:
        """After clear no id is registered."""
        registry = ChannelRegistry()
        registry.add([desc("a:1"), desc("a:2")])
        registry.clear()
        assert registry.get("a:1") is None and registry.channels() == []

    @given(st.lists(descriptors, max_size=12), st.sampled_from([None, ["a:*"], []]))
    def test_no_batch_smuggles_a_forbidden_or_malformed_descriptor_in(self, batch: list[Any],
                                                                       patterns: list[str] | None) -> None:
        """For any batch: one result per item, and every registered channel is well formed and permitted."""
        registry = ChannelRegistry(patterns)
        results, accepted = registry.add(batch)
        assert len(results) == len(batch)
        assert sum(r["accepted"] for r in results) == len(accepted)
        for channel in registry.channels():
            assert isinstance(parse_descriptor(channel.descriptor()), Channel)
            assert permitted(channel.id, patterns)
        assert len({c.id for c in accepted}) == len(accepted)


class TestLimit:
    def test_a_full_registry_refuses_new_ids_with_channel_limit_but_still_replaces(self) -> None:
        """Over MAX_CHANNELS a new id is refused, itemized; re-registering a known id still works."""
        registry = ChannelRegistry(limit=2)
        results, accepted = registry.add([desc("a:1"), desc("a:2"), desc("a:3")])
        assert [r.get("reason") for r in results] == [None, None, CHANNEL_LIMIT]
        assert [c.id for c in accepted] == ["a:1", "a:2"]
        results, _ = registry.add([desc("a:1", label="#renamed")])
        assert results == [{"id": "a:1", "accepted": True}] and registry.get("a:1").label == "#renamed"
        registry.remove(["a:2"])
        assert registry.add([desc("a:3")])[0] == [{"id": "a:3", "accepted": True}]

    def test_the_default_limit_is_generous(self) -> None:
        """A real connector's few hundred channels are far below the default cap."""
        assert ChannelRegistry().limit == MAX_CHANNELS >= 10_000


class TestDescriptorBounds:
    def test_each_bound_refuses_the_descriptor_whole_and_the_bound_itself_passes(self) -> None:
        from mcplhost.protocol.channels import (
            MAX_CHANNEL_ADDRESS_BYTES,
            MAX_CHANNEL_METADATA_BYTES,
            MAX_CHANNEL_TEXT_CHARS,
            TOO_LARGE,
        )

        def sized(limit: int, extra: int) -> dict[str, str]:
            return {"k": "x" * (limit - len('{"k":""}') + extra)}  # exactly `limit` bytes of JSON, plus extra

        assert isinstance(parse_descriptor(desc("a" * MAX_CHANNEL_TEXT_CHARS, label="l", address=sized(MAX_CHANNEL_ADDRESS_BYTES, 0),
                                                metadata=sized(MAX_CHANNEL_METADATA_BYTES, 0))), Channel)
        for over in (desc("a" * (MAX_CHANNEL_TEXT_CHARS + 1)), desc("a:1", label="l" * (MAX_CHANNEL_TEXT_CHARS + 1)),
                     desc("a:1", type="t" * (MAX_CHANNEL_TEXT_CHARS + 1)),
                     desc("a:1", address=sized(MAX_CHANNEL_ADDRESS_BYTES, 1)),
                     desc("a:1", metadata=sized(MAX_CHANNEL_METADATA_BYTES, 1))):
            assert parse_descriptor(over) == TOO_LARGE
        results, accepted = ChannelRegistry().add([desc("a:1", metadata=sized(MAX_CHANNEL_METADATA_BYTES, 1)),
                                                    desc("a:2")])
        assert [r.get("reason") for r in results] == [TOO_LARGE, None] and [c.id for c in accepted] == ["a:2"]
