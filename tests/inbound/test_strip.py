"""Tests for mcplhost/inbound/strip.py: HOST_METADATA_KEYS and strip_host_keys."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.inbound import HOST_METADATA_KEYS, strip_host_keys

# docs/provenance.md §1, written out again so a change to the constant is seen.
PROVENANCE_KEYS = {
    "system", "kind", "draftOwner", "draftIds", "tuneOut", "coalescingSubject", "firstView",
    "deferredWriteId", "external", "openaiResponsesItems", "sourceHeader", "sourceBodyDigest",
    "storedBodyDigest", "inboundSource",
}

metadata_objects = st.dictionaries(
    st.one_of(st.sampled_from(sorted(PROVENANCE_KEYS | {"source", "replyTo", "tags", "mentions"})), st.text()),
    st.one_of(st.none(), st.integers(), st.text(), st.lists(st.text(), max_size=2)),
    max_size=8,
)


class TestHostMetadataKeys:
    def test_exactly_the_fourteen_keys(self) -> None:
        """The constant holds exactly the keys docs/provenance.md §1 lists."""
        assert HOST_METADATA_KEYS == PROVENANCE_KEYS
        assert len(HOST_METADATA_KEYS) == 14

    def test_source_is_not_a_host_key(self) -> None:
        """`source` stays, because connectors use `origin.source` legitimately."""
        assert "source" not in HOST_METADATA_KEYS

    def test_is_immutable(self) -> None:
        """The constant is a frozenset, so no caller can add or remove a key."""
        assert isinstance(HOST_METADATA_KEYS, frozenset)


class TestStripHostKeys:
    @pytest.mark.parametrize("key", sorted(PROVENANCE_KEYS))
    def test_each_host_key_is_dropped(self, key: str) -> None:
        """Every key of the set is removed and reported, and the connector's other keys stay."""
        kept, dropped = strip_host_keys({"mentions": ["@scout"], key: "forged", "source": "heartbeat"})
        assert kept == {"mentions": ["@scout"], "source": "heartbeat"}
        assert dropped == (key,)

    def test_dropped_keys_in_the_objects_order(self) -> None:
        """The dropped keys are reported in the order the connector's object holds them."""
        _, dropped = strip_host_keys({"system": True, "a": 1, "kind": "x", "sourceHeader": "[source: y]"})
        assert dropped == ("system", "kind", "sourceHeader")

    def test_none_gives_empty(self) -> None:
        """No object gives an empty copy and nothing dropped."""
        assert strip_host_keys(None) == ({}, ())

    def test_clean_object_is_copied(self) -> None:
        """An object with no host keys comes back equal but as a new dict."""
        obj = {"a": 1}
        kept, dropped = strip_host_keys(obj)
        assert kept == obj and kept is not obj and dropped == ()

    def test_values_kept_as_sent(self) -> None:
        """Values of kept keys are the very objects the connector sent."""
        nested = {"deep": [1, 2]}
        kept, _ = strip_host_keys({"meta": nested, "kind": "notice"})
        assert kept["meta"] is nested

    def test_host_keys_nested_deeper_are_not_touched(self) -> None:
        """Only top-level keys are host keys; a nested `kind` is the connector's own data."""
        kept, dropped = strip_host_keys({"payload": {"kind": "x"}})
        assert kept == {"payload": {"kind": "x"}} and dropped == ()

    @given(metadata_objects)
    def test_partitions_the_keys(self, obj: dict[str, Any]) -> None:
        """Kept and dropped keys together are the object's keys, in order, and no host key is kept."""
        before = copy.deepcopy(obj)
        kept, dropped = strip_host_keys(obj)
        assert obj == before
        assert not HOST_METADATA_KEYS & kept.keys()
        assert set(dropped) <= HOST_METADATA_KEYS
        assert [key for key in obj if key not in kept] == list(dropped)
        assert kept == {key: value for key, value in obj.items() if key not in HOST_METADATA_KEYS}
        assert list(kept) == [key for key in obj if key in kept]
