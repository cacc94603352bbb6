"""JSON-RPC error codes MCPL uses, and the error a connector earns.

SPEC §6.6 requires every refusal to be a JSON-RPC error object with the
documented code, never a result carrying a failure flag. The codes and their
`data` shapes live here as data (SPEC Appendix A); the helper constructors are
the only places that build them, so a code and its `data` never drift apart.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from mcplhost.rpc.errors import ReplyError

# Standard JSON-RPC 2.0 codes are owned by the rpc layer; re-exported (the
# `X as X` form says so to the type checker) so that protocol code finds every
# code it answers with in one module.
from mcplhost.rpc.messages import INTERNAL_ERROR as INTERNAL_ERROR
from mcplhost.rpc.messages import INVALID_PARAMS as INVALID_PARAMS
from mcplhost.rpc.messages import INVALID_REQUEST as INVALID_REQUEST
from mcplhost.rpc.messages import METHOD_NOT_FOUND as METHOD_NOT_FOUND
from mcplhost.rpc.messages import PARSE_ERROR as PARSE_ERROR

# MCPL (SPEC Appendix A, §6.6, §14.6).
FEATURE_SET_NOT_ENABLED = -32001
CAPABILITY_DENIED = -32002
FEATURE_SET_NOT_DECLARED = -32003
CHECKPOINT_NOT_FOUND = -32005
CHANNEL_NOT_PERMITTED = -32017
UNKNOWN_CHANNEL = -32023
CHANNEL_OPEN_FAILED = -32024

# The `reason` a -32001 carries when the set is enabled but did not declare the
# capability it tried to use.
DECLARATION_MISMATCH = "declaration_mismatch"


class ConnectorProtocolError(ReplyError):
    """The connector broke the protocol or asked for what it may not have.

    Carries the JSON-RPC error to answer with: `code`, `message` and `data`
    (a dict, or msgspec.UNSET when there is none, as in rpc's ReplyError).
    Being a ReplyError, a handler can raise it and the rpc layer's single
    exception mapper turns it into the wire error; pure checks return it
    instead, so that a decision stays a value.
    """

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(code, message, UNSET if data is None else dict(data))

    def __repr__(self) -> str:
        data = "" if self.data is UNSET else f", data={self.data!r}"
        return f"ConnectorProtocolError(code={self.code}, message={self.message!r}{data})"


def capability_denied(capability: str, reason: str | None = None) -> ConnectorProtocolError:
    """-32002: the capability is not in the effective grant (e.g. reason "policy_pending")."""
    data: dict[str, Any] = {"capability": capability}
    if reason is not None:
        data["reason"] = reason
    return ConnectorProtocolError(CAPABILITY_DENIED, "Capability denied", data)


def feature_set_not_enabled(feature_set: str) -> ConnectorProtocolError:
    """-32001 with `data: {featureSet}` and nothing else: no hint of what could be enabled."""
    return ConnectorProtocolError(
        FEATURE_SET_NOT_ENABLED, "Feature set not enabled", {"featureSet": feature_set}
    )


def feature_set_not_declared(feature_set: str) -> ConnectorProtocolError:
    """-32003: the feature set was never declared in the manifest."""
    return ConnectorProtocolError(
        FEATURE_SET_NOT_DECLARED, "Unknown feature set", {"featureSet": feature_set}
    )


def declaration_mismatch(feature_set: str, capability: str) -> ConnectorProtocolError:
    """-32001: an enabled feature set used a capability its `uses` does not list."""
    return ConnectorProtocolError(
        FEATURE_SET_NOT_ENABLED,
        "Feature set did not declare this capability",
        {"featureSet": feature_set, "capability": capability, "reason": DECLARATION_MISMATCH},
    )


def invalid_params(message: str, data: dict[str, Any] | None = None) -> ConnectorProtocolError:
    """-32602: the params are missing, mistyped or malformed."""
    return ConnectorProtocolError(INVALID_PARAMS, message, data)


def method_not_found(method: str) -> ConnectorProtocolError:
    """-32601: unknown, removed (e.g. `featureSets/changed`) or deferred methods."""
    return ConnectorProtocolError(METHOD_NOT_FOUND, "Method not found", {"method": method})


def channel_not_permitted(channel_id: str) -> ConnectorProtocolError:
    """-32017: no authority to publish to or receive from this channel."""
    return ConnectorProtocolError(
        CHANNEL_NOT_PERMITTED, "Channel not permitted", {"channelId": channel_id}
    )


def unknown_channel(channel_id: str) -> ConnectorProtocolError:
    """-32023: the channel id does not exist or was never registered on this connection."""
    return ConnectorProtocolError(UNKNOWN_CHANNEL, "Unknown channel", {"channelId": channel_id})


#: The `reason` of an item refused because its connector is past a quota (docs/operations.md#quotas).
QUOTA_REASON = "quota"


def quota_reached(quota: str, retry_after_ms: int | None) -> ConnectorProtocolError:
    """-32603 with `data: {reason: "quota", quota, retryAfterMs?}`: storing it would pass a per-connector quota.

    The code of the host's other resource refusal (`busy`, docs/connectors.md §15); `retryAfterMs` is
    when the sliding hour next has room for the item, absent when the item alone is larger than the quota.
    """
    data: dict[str, Any] = {"reason": QUOTA_REASON, "quota": quota}
    if retry_after_ms is not None:
        data["retryAfterMs"] = retry_after_ms
    return ConnectorProtocolError(INTERNAL_ERROR, "Quota reached", data)
