"""Tests for mcplhost/protocol/errors.py."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from msgspec import UNSET

from mcplhost.protocol import errors
from mcplhost.protocol.errors import ConnectorProtocolError
from mcplhost.rpc.errors import ReplyError, error_for


def wire(refusal: ConnectorProtocolError) -> dict[str, Any]:
    """The JSON-RPC error object the rpc layer answers `refusal` with, as plain data."""
    return msgspec.to_builtins(error_for(refusal))


class TestCodes:
    @pytest.mark.parametrize(
        ("name", "code"),
        [
            ("FEATURE_SET_NOT_ENABLED", -32001),
            ("CAPABILITY_DENIED", -32002),
            ("FEATURE_SET_NOT_DECLARED", -32003),
            ("CHECKPOINT_NOT_FOUND", -32005),
            ("CHANNEL_NOT_PERMITTED", -32017),
            ("UNKNOWN_CHANNEL", -32023),
            ("CHANNEL_OPEN_FAILED", -32024),
            ("PARSE_ERROR", -32700),
            ("INVALID_REQUEST", -32600),
            ("METHOD_NOT_FOUND", -32601),
            ("INVALID_PARAMS", -32602),
            ("INTERNAL_ERROR", -32603),
        ],
    )
    def test_documented_values(self, name: str, code: int) -> None:
        """Each named code has the value SPEC Appendix A or JSON-RPC 2.0 gives it."""
        assert getattr(errors, name) == code


class TestConnectorProtocolError:
    def test_is_an_exception_carrying_the_reply(self) -> None:
        """It can be raised, and keeps the code, message and data to answer with."""
        with pytest.raises(ConnectorProtocolError) as caught:
            raise ConnectorProtocolError(-32602, "bad", {"field": "x"})
        assert (caught.value.code, caught.value.message, caught.value.data) == (
            -32602,
            "bad",
            {"field": "x"},
        )

    def test_the_error_object_omits_absent_data(self) -> None:
        """The JSON-RPC error object has no `data` member when there is none."""
        refusal = ConnectorProtocolError(-32603, "oops")
        assert refusal.data is UNSET
        assert wire(refusal) == {"code": -32603, "message": "oops"}

    def test_rpc_layer_maps_it(self) -> None:
        """It is a ReplyError, so rpc's one exception mapper answers with its code and data."""
        refusal = errors.capability_denied("modelInfo")
        assert isinstance(refusal, ReplyError)
        wire = error_for(refusal)
        assert (wire.code, wire.message, wire.data) == (-32002, "Capability denied", {"capability": "modelInfo"})

    def test_data_is_copied(self) -> None:
        """Mutating the caller's dict afterwards does not change the refusal."""
        data = {"capability": "pushEvents"}
        refusal = ConnectorProtocolError(-32002, "Capability denied", data)
        data["capability"] = "tools"
        assert wire(refusal)["data"] == {"capability": "pushEvents"}


class TestHelpers:
    def test_capability_denied(self) -> None:
        """-32002 carries the capability, and a reason only when given."""
        assert wire(errors.capability_denied("modelInfo")) == {
            "code": -32002,
            "message": "Capability denied",
            "data": {"capability": "modelInfo"},
        }
        assert errors.capability_denied("pushEvents", "policy_pending").data == {
            "capability": "pushEvents",
            "reason": "policy_pending",
        }

    def test_feature_set_not_enabled_has_no_hint(self) -> None:
        """-32001 data is exactly {featureSet}: no canEnable or other hint (docs/mcpl-checklist.md item 16)."""
        refusal = errors.feature_set_not_enabled("memory.x")
        assert (refusal.code, refusal.data) == (-32001, {"featureSet": "memory.x"})

    def test_feature_set_not_declared(self) -> None:
        """-32003 names the unknown feature set."""
        refusal = errors.feature_set_not_declared("nope")
        assert (refusal.code, refusal.data) == (-32003, {"featureSet": "nope"})

    def test_declaration_mismatch(self) -> None:
        """A mismatch is -32001 with featureSet, capability and the mismatch reason."""
        refusal = errors.declaration_mismatch("fs", "pushEvents")
        assert (refusal.code, refusal.data) == (
            -32001,
            {"featureSet": "fs", "capability": "pushEvents", "reason": "declaration_mismatch"},
        )

    def test_invalid_params(self) -> None:
        """-32602 carries the given message and data."""
        refusal = errors.invalid_params("eventId is required", {"field": "eventId"})
        assert wire(refusal) == {
            "code": -32602,
            "message": "eventId is required",
            "data": {"field": "eventId"},
        }

    def test_method_not_found(self) -> None:
        """-32601 names the method."""
        refusal = errors.method_not_found("scope/elevate")
        assert (refusal.code, refusal.data) == (-32601, {"method": "scope/elevate"})

    def test_channel_errors(self) -> None:
        """Channel refusals use -32017 and -32023 and name the channel."""
        assert wire(errors.channel_not_permitted("c1"))["code"] == -32017
        assert wire(errors.unknown_channel("c2")) == {
            "code": -32023,
            "message": "Unknown channel",
            "data": {"channelId": "c2"},
        }
