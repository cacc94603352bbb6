"""The policy exchange as pure rules: what a featureSets/update says, and what its answer means.

SPEC §5.3 and §6.7; the host's rules are docs/grants.md. `McplConnection` sends the request and applies the result;
everything decided here depends only on the values passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from msgspec import Raw

from mcplhost.jsonobject import JsonObject
from mcplhost.rpc import RemoteError
from mcplhost.rpc.messages import METHOD_NOT_FOUND

from .featuresets import OPERATOR_REASONS, FeatureSetState
from .grants import denied_paths
from .params import Receipt

FALLBACKS = ("mcp-only", "close")


def policy_params(capabilities: dict[str, Any], grant: frozenset[str], states: Mapping[str, FeatureSetState],
                  *, legacy: bool, selection_given: bool) -> JsonObject:
    """featureSets/update params: the grant always, denied paths disjoint from it, the selection.

    In 0.5 mode `disabled` names every set that is off, derived reasons
    included (fail closed, SPEC §6.4). In legacy (0.4) mode it names only the sets
    the operator deselected: legacy `uses` does not gate (docs/mcpl-compat.md), and a
    connector that honours `disabled` (discord-mcpl) would otherwise go
    silent for a set whose `uses` merely lists a path outside the grant. The
    host still enforces the grant on everything the connector sends.
    """

    def off(state: FeatureSetState) -> bool:
        return state.reason in OPERATOR_REASONS if legacy else not state.enabled

    params: dict[str, Any] = {
        "effectiveCapabilities": sorted(grant),
        "deniedCapabilities": denied_paths(capabilities, grant),
        "disabled": sorted(name for name, state in states.items() if off(state)),
    }
    if selection_given:
        params["enabled"] = sorted(name for name, state in states.items() if not off(state))
    return params


def interim(current_grant: frozenset[str], current_states: Mapping[str, FeatureSetState], grant: frozenset[str],
            derive: Callable[[frozenset[str]], dict[str, FeatureSetState]],
            ) -> tuple[frozenset[str], dict[str, FeatureSetState]]:
    """The part of a change to `grant` that applies before its receipt: only what narrows.

    Paths the new grant drops go at once; paths it adds wait for the
    receipt. Likewise a feature set is enabled in the meantime only if it is
    enabled both before and after, using only what it used before and still
    uses; a set enabled only by the change stays as it was (or undeclared)
    until the receipt.
    """
    kept = current_grant & grant
    states: dict[str, FeatureSetState] = {}
    for name, new in derive(kept).items():
        old = current_states.get(name)
        if not new.enabled:
            states[name] = new
        elif old is not None and old.enabled:
            states[name] = msgspec.structs.replace(new, uses=new.uses & old.uses)
        elif old is not None:
            states[name] = old
    return kept, states


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """What an answer to featureSets/update means for the connection."""

    ready: bool
    fallback: str | None = None  # set exactly when not ready: "mcp-only" or "close"
    why: str = ""
    legacy_ack: bool = False  # -32601 from a legacy server: acknowledged
    defects: tuple[str, ...] = ()  # conformance defects to log
    mode: str = "full"  # the receipt's own account ("degraded"), for the log
    unavailable: int = 0


def judge_receipt(outcome: Raw | RemoteError, *, legacy: bool, initial: bool, strict: bool,
                  operator_fallback: str) -> Verdict:
    """Judge the answer to a policy request. The receipt never widens anything.

    - -32601 from a legacy server (or to the initial policy unless the
      connector is configured strictly 0.5) means acknowledged (docs/mcpl-compat.md);
    - any other error, an unusable receipt, or a refusal without a valid
      fallback: the operator's fallback;
    - `accepted: false` with fallback "mcp-only" or "close": that fallback.
    """
    if isinstance(outcome, RemoteError):
        if outcome.code == METHOD_NOT_FOUND and (legacy or (initial and not strict)):
            return Verdict(ready=True, legacy_ack=True)
        return Verdict(ready=False, fallback=operator_fallback, why=f"policy answered with error {outcome.code}")
    try:
        receipt = msgspec.json.decode(bytes(outcome), type=Receipt)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return Verdict(ready=False, fallback=operator_fallback, why="unusable receipt",
                       defects=("unusable policy receipt",))
    if receipt.accepted:
        defects = tuple("unavailableFeatures entry without effect" for entry in receipt.unavailableFeatures
                        if not isinstance(entry, dict) or "effect" not in entry)
        return Verdict(ready=True, defects=defects, mode=receipt.mode or "full",
                       unavailable=len(receipt.unavailableFeatures))
    if receipt.fallback not in FALLBACKS:
        return Verdict(ready=False, fallback=operator_fallback, why="policy refused",
                       defects=("refusal without a valid fallback",))
    return Verdict(ready=False, fallback=receipt.fallback, why="policy refused")
