"""Feature sets: declarations, derivation from the grant, and admission (SPEC §6).

Feature sets are named bundles of behaviour a server declares. They carry no
authority of their own: the grant is the security boundary, and feature sets
only ever narrow it. The rules here:

- normalize the declarations (0.5 object form or the deployed 0.4 array form);
- derive each set's state from the declaration, the grant and the operator's
  selection, failing closed (SPEC §6.4);
- decide admission of a server-initiated message that names a feature set
  (SPEC §9; the last three checks of docs/connectors.md §8), returning the refusal rather than raising.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from mcplhost.protocol.errors import (
    ConnectorProtocolError,
    declaration_mismatch,
    feature_set_not_declared,
    feature_set_not_enabled,
    invalid_params,
)
from mcplhost.protocol.vocabulary import CAPABILITY_PATHS

# Why a feature set is disabled. The operator's reasons come first: they are
# the primary fact, and the derived ones only explain a set the operator wanted.
NOT_SELECTED = "not_selected"  # `enabled` was given and does not name it
DISABLED = "disabled"  # named in `disabled`
INVALID_USES = "invalid_uses"  # `uses` absent, empty, not a list, or naming an unknown path
CAPABILITY_DENIED = "capability_denied"  # `uses` names a path outside the grant

OPERATOR_REASONS: frozenset[str] = frozenset({NOT_SELECTED, DISABLED})


class FeatureSetState(msgspec.Struct, frozen=True, kw_only=True):
    """One declared feature set as the host currently sees it."""

    name: str
    enabled: bool
    reason: str | None  # None exactly when enabled
    uses: frozenset[str]  # the declared paths the host recognizes


def normalize_feature_sets(raw: Any) -> dict[str, dict[str, Any]]:
    """Declarations keyed by name, from either wire shape.

    0.5 sends an object keyed by name; deployed 0.4 connectors send an array
    of `{name, description, uses, ...}` (docs/mcpl-compat.md). Entries without a usable
    (non-empty string) name are skipped. A declaration that is not an object,
    or a name the array form declares twice, becomes an empty declaration:
    it stays declared but derives to `invalid_uses` instead of silently
    vanishing or letting one copy win.
    """
    declared: dict[str, dict[str, Any]] = {}
    if isinstance(raw, dict):
        for name, declaration in raw.items():
            if isinstance(name, str) and name:
                declared[name] = dict(declaration) if isinstance(declaration, dict) else {}
    elif isinstance(raw, list):
        for entry in raw:
            name = entry.get("name") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not name:
                continue
            if name in declared:
                declared[name] = {}
                continue
            declared[name] = {key: value for key, value in entry.items() if key != "name"}
    return declared


def uses_valid(declaration: Any) -> bool:
    """Whether `uses` is a non-empty list naming only the 17 vocabulary paths.

    A parent such as `contextHooks.beforeInference` is not a path, so it is
    invalid (SPEC §6.1's own example is stale).
    """
    uses = declaration.get("uses") if isinstance(declaration, dict) else None
    return (
        isinstance(uses, list)
        and bool(uses)
        and all(isinstance(path, str) and path in CAPABILITY_PATHS for path in uses)
    )


def selection_matches(pattern: str, name: str) -> bool:
    """Whether a feature-set selection pattern names `name`.

    Names are dot-separated like capability paths. A `*` segment matches one
    segment, except in last place, where it matches one or more: `memory.*`
    selects "all `memory.` features" (SPEC §6.3), `memory.retrieval.fast`
    included. Without a `*` the pattern must equal the name.
    """
    wanted = pattern.split(".")
    segments = name.split(".")
    if wanted[-1] == "*":
        head = wanted[:-1]
        return len(segments) > len(head) and _segments_match(head, segments[: len(head)])
    return len(wanted) == len(segments) and _segments_match(wanted, segments)


def _segments_match(wanted: list[str], segments: list[str]) -> bool:
    return all(w == "*" or w == s for w, s in zip(wanted, segments))


def expand_selection(patterns: Iterable[str], names: Iterable[str]) -> list[str]:
    """Concrete feature-set names for `enabled`/`disabled`, sorted and unique.

    Wildcards are expanded against the declared `names` on the host (a host
    MAY support them; the wire carries concrete names). A pattern without a
    `*` is kept as written even if nothing declares it.
    """
    declared = list(names)
    selected: set[str] = set()
    for pattern in patterns:
        if not isinstance(pattern, str):
            continue
        if "*" in pattern.split("."):
            selected.update(name for name in declared if selection_matches(pattern, name))
        else:
            selected.add(pattern)
    return sorted(selected)


def _disable_reason(
    name: str,
    uses_ok: bool,
    uses: frozenset[str],
    grant: frozenset[str],
    enabled: set[str] | None,
    disabled: set[str],
) -> str | None:
    if enabled is not None and name not in enabled:
        return NOT_SELECTED
    if name in disabled:
        return DISABLED
    if not uses_ok:
        return INVALID_USES
    if not uses <= grant:
        return CAPABILITY_DENIED
    return None


def derive_feature_sets(
    declared: Mapping[str, Any],
    grant: Iterable[str],
    enabled: list[str] | None,
    disabled: list[str],
) -> dict[str, FeatureSetState]:
    """Each declared feature set's state under this grant and selection.

    `declared` is the normalized, name-keyed form; `enabled` and `disabled`
    are the operator's selection (wildcards allowed). A set is disabled when
    `enabled` is given and does not name it (`not_selected`), when `disabled`
    names it (`disabled`), when its `uses` is invalid (`invalid_uses`, fail
    closed), or when `uses` names a path outside the grant
    (`capability_denied`, a derived degradation); otherwise it is enabled.
    Naming a set never gives it capabilities.
    """
    granted = frozenset(grant)
    names = list(declared)
    chosen = set(expand_selection(enabled, names)) if enabled is not None else None
    removed = set(expand_selection(disabled, names))
    states: dict[str, FeatureSetState] = {}
    for name, declaration in declared.items():
        raw_uses = declaration.get("uses") if isinstance(declaration, dict) else None
        uses = frozenset(
            path
            for path in (raw_uses if isinstance(raw_uses, list) else ())
            if isinstance(path, str) and path in CAPABILITY_PATHS
        )
        reason = _disable_reason(name, uses_valid(declaration), uses, granted, chosen, removed)
        states[name] = FeatureSetState(name=name, enabled=reason is None, reason=reason, uses=uses)
    return states


def check_feature_set(
    states: Mapping[str, FeatureSetState],
    feature_set: Any,
    capability: str,
    *,
    legacy: bool,
) -> ConnectorProtocolError | None:
    """Admission of a server-initiated message naming `feature_set` (SPEC §9; docs/connectors.md §8).

    Returns the refusal to answer with, or None to admit. The caller has
    already checked readiness, the grant for `capability` (-32002) and the
    params (-32602); a missing or non-string `featureSet` is refused here too.

    - not declared → -32003 `{featureSet}`;
    - not enabled → -32001 `{featureSet}` (nothing else: never a hint of what
      could be enabled);
    - `uses` does not contain `capability` → -32001
      `{featureSet, capability, reason: "declaration_mismatch"}`.

    Legacy (0.4) connectors declare `uses` in the old flat vocabulary and
    send events their `uses` never listed (heartbeat declares `["tools"]` and
    pushes). docs/mcpl-compat.md: in legacy mode `uses` does not gate, while the
    connection grant still does. So with `legacy=True` a set disabled only
    for a reason derived from `uses` (`invalid_uses`, `capability_denied`)
    is admitted and the mismatch check is skipped; the operator's selection
    (`not_selected`, `disabled`) and the declared check still apply.
    """
    if not isinstance(feature_set, str) or not feature_set:
        return invalid_params("featureSet must be a non-empty string", {"field": "featureSet"})
    state = states.get(feature_set)
    if state is None:
        return feature_set_not_declared(feature_set)
    if legacy:
        return feature_set_not_enabled(feature_set) if state.reason in OPERATOR_REASONS else None
    if not state.enabled:
        return feature_set_not_enabled(feature_set)
    if capability not in state.uses:
        return declaration_mismatch(feature_set, capability)
    return None
