"""Tests for mcplhost/protocol/admission.py: one incoming message or one push, judged at receipt (docs/connectors.md §6 and §7)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcplhost.protocol.admission import admit_message, admit_push
from mcplhost.protocol.channels import ChannelRegistry
from mcplhost.protocol.errors import ConnectorProtocolError
from mcplhost.protocol.featuresets import FeatureSetState
from mcplhost.protocol.intake import AdmittedMessage, AdmittedPush
from mcplhost.protocol.params import PushEvent

TEXT = [{"type": "text", "text": "hello"}]


def registry(*channels: dict[str, Any]) -> ChannelRegistry:
    reg = ChannelRegistry()
    reg.add([{"id": "d:1", "label": "#one"}, {"id": "d:out", "direction": "outbound"}, *channels])
    return reg


def raw_message(**fields: Any) -> dict[str, Any]:
    return {"channelId": "d:1", "messageId": "m-1", "content": TEXT, **fields}


def state(name: str, uses: set[str], enabled: bool = True, reason: str | None = None) -> FeatureSetState:
    return FeatureSetState(name=name, enabled=enabled, reason=reason, uses=frozenset(uses))


STATES = {
    "alerts": state("alerts", {"pushEvents"}),
    "chat": state("chat", {"channels.register"}),
    "off": state("off", {"pushEvents"}, False, "disabled"),
    "unselected": state("unselected", {"pushEvents"}, False, "not_selected"),
    "broken": state("broken", set(), False, "invalid_uses"),
}


def a_push(feature_set: str = "alerts", **fields: Any) -> PushEvent:
    return msgspec.convert({"featureSet": feature_set, "eventId": "e-1", "timestamp": "2026-01-01T00:00:00Z",
                            "payload": {"content": TEXT}, **fields}, PushEvent)


def refused(error: ConnectorProtocolError) -> tuple[int, Any]:
    return error.code, error.data


class TestAdmitMessage:
    def test_a_message_on_a_registered_channel_is_admitted_with_the_registered_label(self) -> None:
        """The channel and its label come from this connection's registry, never from the message."""
        admitted = admit_message(raw_message(label="#forged", author={"id": 7}), registry(), None)
        assert isinstance(admitted, AdmittedMessage)
        assert (admitted.channel_id, admitted.label, admitted.participant) == ("d:1", "#one", "7")

    def test_an_unregistered_channel_is_refused_minus_32023(self) -> None:
        """A channel id this connection never registered is unknown, whatever the message claims."""
        assert admit_message(raw_message(channelId="d:9"), registry(), None) == {
            "accepted": False, "reason": "unknown_channel", "code": -32023, "messageId": "m-1"}

    def test_an_outbound_only_channel_is_refused_minus_32017(self) -> None:
        """Messages may not come in from a channel registered as outbound."""
        assert admit_message(raw_message(channelId="d:out"), registry(), None) == {
            "accepted": False, "reason": "channel_not_permitted", "code": -32017, "messageId": "m-1"}

    @pytest.mark.parametrize(("raw", "field", "problem"), [
        ({"channelId": "d:1", "messageId": "m-1"}, "content", "required member missing"),
        ({"channelId": "d:1", "messageId": "m-1", "content": "hello"}, "content", "expected array, got str"),
        ({"channelId": 5, "messageId": "m-1", "content": TEXT}, "channelId", "expected str, got int"),
        ({"channelId": "d:1", "messageId": "m-1", "content": TEXT, "tags": "chat:dm"}, "tags",
         "expected array, got str"),
        ({"channelId": "d:1", "messageId": "m-1", "content": [7]}, "content[0]", "expected object, got int"),
        ({"channelId": "d:1", "messageId": "m-1", "content": TEXT, "author": {"id": [1]}}, "author.id",
         "expected int | str | null, got array"),
    ])
    def test_a_malformed_message_is_refused_minus_32602_naming_field_and_problem(
            self, raw: dict[str, Any], field: str, problem: str) -> None:
        """Missing or mistyped members refuse that one message as invalid_message, saying which and why."""
        outcome = admit_message(raw, registry(), None)
        assert outcome == {"accepted": False, "reason": "invalid_message", "code": -32602, "messageId": "m-1",
                           "field": field, "problem": problem}

    def test_a_message_that_is_not_an_object_names_the_whole_value(self) -> None:
        """A batch element that is not an object is refused with field "$"."""
        outcome = admit_message("not an object", registry(), None)
        assert isinstance(outcome, dict) and (outcome["field"], outcome["problem"]) == ("$", "expected object, got str")

    def test_a_refusal_without_a_string_message_id_carries_none(self) -> None:
        """A refusal repeats the messageId only when the connector sent a string one."""
        assert "messageId" not in admit_message({"channelId": "d:1", "messageId": 3}, registry(), None)
        assert "messageId" not in admit_message("not an object", registry(), None)

    def test_participant_reply_and_thread_come_from_the_message(self) -> None:
        """author.name is preferred to author.id; replyTo falls back to metadata.replyTo."""
        admitted = admit_message(raw_message(author={"id": "u1", "name": "Alice"}, threadId="t-1",
                                             metadata={"replyTo": "m-0"}), registry(), None)
        assert (admitted.participant, admitted.thread_id, admitted.reply_to) == ("Alice", "t-1", "m-0")
        own = admit_message(raw_message(replyTo="m-own", metadata={"replyTo": "m-0"}), registry(), None)
        assert own.reply_to == "m-own"

    def test_the_author_id_is_kept_apart_from_the_display_name(self) -> None:
        """author.id is admitted as text (wake_from matches it, never the name); no id is None."""
        named = admit_message(raw_message(author={"id": 1234, "name": "Alice"}), registry(), None)
        assert (named.participant, named.author_id) == ("Alice", "1234")
        assert admit_message(raw_message(author={"name": "Bob"}), registry(), None).author_id is None
        assert admit_message(raw_message(), registry(), None).author_id is None

    def test_tags_are_expanded_and_never_change_admission(self) -> None:
        """The core closure runs on admitted messages; tags do not admit an unknown channel."""
        admitted = admit_message(raw_message(tags=["chat:dm", "chat:ambient"]), registry(), None)
        assert admitted.tags == ["chat:addressed", "chat:dm", "chat:private"]
        assert admit_message(raw_message(channelId="d:9", tags=["chat:dm"]), registry(), None)["code"] == -32023

    def test_accepted_producer_edges_are_applied(self) -> None:
        """Edges passed in as accepted are followed; without them the tag stays alone."""
        accepted = admit_message(raw_message(tags=["x:urgent"]), registry(), {"x:urgent": ["chat:mention"]})
        assert accepted.tags == ["chat:addressed", "chat:mention", "x:urgent"]
        assert admit_message(raw_message(tags=["x:urgent"]), registry(), None).tags == ["x:urgent"]


class TestAdmitPush:
    def test_a_push_of_an_enabled_set_that_uses_push_events_is_admitted_unscoped(self) -> None:
        """Without origin.mcplChannelId a push belongs to no channel."""
        admitted = admit_push(a_push(), registry(), STATES, legacy=False, accepted_implies=None)
        assert isinstance(admitted, AdmittedPush)
        assert (admitted.feature_set, admitted.event_id, admitted.channel_id, admitted.label) == ("alerts", "e-1",
                                                                                                  None, None)

    @pytest.mark.parametrize(("feature_set", "code", "data"), [
        ("nope", -32003, {"featureSet": "nope"}),
        ("off", -32001, {"featureSet": "off"}),
        ("unselected", -32001, {"featureSet": "unselected"}),
        ("broken", -32001, {"featureSet": "broken"}),
        ("chat", -32001, {"featureSet": "chat", "capability": "pushEvents", "reason": "declaration_mismatch"}),
        ("", -32602, {"field": "featureSet"}),
    ])
    def test_declared_then_enabled_then_uses(self, feature_set: str, code: int, data: dict[str, Any]) -> None:
        """Undeclared is -32003, disabled -32001 {featureSet}, a set without pushEvents a declaration mismatch."""
        with pytest.raises(ConnectorProtocolError) as caught:
            admit_push(a_push(feature_set), registry(), STATES, legacy=False, accepted_implies=None)
        assert refused(caught.value) == (code, data)

    def test_legacy_connectors_are_not_gated_by_uses_but_by_the_operators_selection(self) -> None:
        """In 0.4 mode an invalid or mismatched `uses` admits; disabled or unselected still refuses (docs/mcpl-compat.md)."""
        for name in ("broken", "chat"):
            assert admit_push(a_push(name), registry(), STATES, legacy=True, accepted_implies=None).feature_set == name
        for name in ("off", "unselected"):
            with pytest.raises(ConnectorProtocolError):
                admit_push(a_push(name), registry(), STATES, legacy=True, accepted_implies=None)
        with pytest.raises(ConnectorProtocolError):
            admit_push(a_push("nope"), registry(), STATES, legacy=True, accepted_implies=None)

    def test_origin_names_a_place_only_when_this_connection_registered_it(self) -> None:
        """origin.mcplChannelId scopes the push to a registered channel; any other id leaves it unscoped."""
        origin = {"mcplChannelId": "d:1", "threadId": "t-1", "messageId": "m-9", "replyTo": "m-8"}
        scoped = admit_push(a_push(origin=origin), registry(), STATES, legacy=False, accepted_implies=None)
        assert (scoped.channel_id, scoped.label, scoped.thread_id, scoped.message_id, scoped.reply_to) == (
            "d:1", "#one", "t-1", "m-9", "m-8")
        elsewhere = admit_push(a_push(origin={**origin, "mcplChannelId": "other:1"}), registry(), STATES,
                               legacy=False, accepted_implies=None)
        assert (elsewhere.channel_id, elsewhere.label, elsewhere.thread_id) == (None, None, None)
        assert elsewhere.origin == {**origin, "mcplChannelId": "other:1"}

    @given(origin=st.dictionaries(st.sampled_from(["mcplChannelId", "threadId", "messageId", "replyTo", "source", "x"]),
                                  st.one_of(st.sampled_from(["d:1", ""]), st.text(max_size=4), st.integers(), st.none(),
                                            st.lists(st.text()))))
    def test_the_origins_claims_are_read_only_as_strings(self, origin: dict[str, Any]) -> None:
        """Each claim counts only as a string (ids non-empty); any other value is no claim, never a refusal."""
        admitted = admit_push(a_push(origin=origin), registry(), STATES, legacy=False, accepted_implies=None)

        def claimed(key: str, *, empty: bool = False) -> str | None:
            value = origin.get(key)
            return value if isinstance(value, str) and (empty or value) else None

        channel = "d:1" if claimed("mcplChannelId") == "d:1" else None
        assert admitted.channel_id == channel and admitted.named_channel == claimed("mcplChannelId", empty=True)
        assert admitted.thread_id == (claimed("threadId") if channel else None)
        assert (admitted.message_id, admitted.reply_to) == (claimed("messageId"), claimed("replyTo"))
        assert admitted.participant == claimed("source", empty=True) and admitted.origin == origin

    def test_push_tags_are_expanded(self) -> None:
        """The core closure applies to push tags too, with ambient removed."""
        admitted = admit_push(a_push(tags=["chat:reply", "chat:ambient"]), registry(), STATES, legacy=False,
                              accepted_implies=None)
        assert admitted.tags == ["chat:addressed", "chat:reply"]
