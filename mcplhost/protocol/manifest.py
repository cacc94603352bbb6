"""Manifest changes (SPEC §17): rate-limited re-fetch, diff, and one change receipt.

`mcpl/manifestChanged` is only a hint: the fetched content decides, never
the revision. Removals are revoked on the host side at once, even from a
partly invalid manifest; additions are never granted automatically, only
reported as pending for the operator. Each change yields one receipt in the
host's own closed vocabulary; no server-written text passes through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from mcplhost.config import FeatureSetSelection
from mcplhost.jsonobject import JsonObject

from .digest import ManifestDigestError, manifest_digest
from .featuresets import FeatureSetState, derive_feature_sets, normalize_feature_sets
from .grants import advertised_paths, effective_grant

#: At most one manifest fetch per this many seconds per connection; more hints are dropped.
MIN_FETCH_INTERVAL_S = 5.0

# The change receipt's closed vocabulary (SPEC §17).
REVOKED = "capability-revoked"
EXPANSION_PENDING = "capability-expansion-pending"
DEGRADED = "feature-degraded"
RESTORED = "feature-restored"
ONTOLOGY_INVALIDATED = "ontology-acceptance-invalidated"
SURFACE_CHANGED = "surface-changed"


class ManifestChange(msgspec.Struct, frozen=True, kw_only=True):
    manifest: dict[str, Any]
    capabilities: dict[str, Any]
    declared: dict[str, dict[str, Any]]
    grant: frozenset[str]
    feature_sets: dict[str, FeatureSetState]
    feature_sets_changed: bool
    ontology_changed: bool
    impacts: list[dict[str, str]]


def _ontologies(declared: Mapping[str, Any]) -> JsonObject:
    return {name: d.get("tagOntology") for name, d in declared.items() if isinstance(d, dict) and "tagOntology" in d}


class ManifestTracker:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._last_fetch = -float("inf")
        self._pending = False
        self.dropped = 0
        self.failures = 0

    def adopt(self, manifest: dict[str, Any]) -> bool:
        """The manifest in force from initialize; False when its revision does not match its content."""
        return self._check_revision(manifest)

    def should_fetch(self) -> bool:
        """A hint arrived: fetch, merge into the pending fetch, or drop over the rate limit."""
        if self._pending:
            return False  # merged into the fetch already scheduled
        if self._clock() - self._last_fetch < MIN_FETCH_INTERVAL_S:
            self.dropped += 1
            return False
        self._pending = True
        return True

    def fetched(self) -> None:
        self._pending = False
        self._last_fetch = self._clock()

    def failed(self) -> None:
        self.failures += 1

    def _check_revision(self, manifest: dict[str, Any]) -> bool:
        """A revision that does not match the content is a defect to log, never a rejection."""
        revision = manifest.get("revision")
        if not isinstance(revision, str):
            return True
        try:
            matches = manifest_digest(manifest) == revision
        except ManifestDigestError:
            matches = False
        return matches

    def diff(
        self,
        old: dict[str, Any],
        fetched: Any,
        capabilities: dict[str, Any],
        grant: frozenset[str],
        policy: list[str],
        states: dict[str, FeatureSetState],
        selection: FeatureSetSelection,
        *,
        offered: frozenset[str],
    ) -> ManifestChange | None:
        """What the fetched manifest changes; None when it is not an object at all.

        `offered` is what this host may grant at all (`grants.offered_paths`):
        a newly advertised path it does not implement is not even pending.
        """
        if not isinstance(fetched, dict):
            self.failures += 1  # nothing learned: the old manifest stays in force
            return None
        self.failures = 0
        digest_ok = self._check_revision(fetched)
        experimental = dict(capabilities.get("experimental") or {})
        experimental["mcpl"] = fetched
        new_capabilities = {**capabilities, "experimental": experimental}
        new_grant = grant & advertised_paths(new_capabilities)  # removals only, never a widening
        pending = (frozenset(effective_grant(new_capabilities, policy)) & offered) - grant
        declared = normalize_feature_sets(fetched.get("featureSets"))
        new_states = derive_feature_sets(declared, new_grant, selection.enabled, list(selection.disabled))
        impacts: list[dict[str, str]] = []
        for path in sorted(grant - new_grant):
            impacts.append({"impact": REVOKED, "disposition": "applied", "capability": path})
        for path in sorted(pending):
            impacts.append({"impact": EXPANSION_PENDING, "disposition": "decision-needed", "capability": path})
        for name in sorted(set(states) | set(new_states)):
            before, after = states.get(name), new_states.get(name)
            was_on, is_on = bool(before and before.enabled), bool(after and after.enabled)
            if was_on and not is_on:
                impacts.append({"impact": DEGRADED, "disposition": "applied", "featureSet": name})
            elif is_on and not was_on:
                impacts.append({"impact": RESTORED, "disposition": "applied", "featureSet": name})
        old_declared = normalize_feature_sets(old.get("featureSets"))
        ontology_changed = _ontologies(old_declared) != _ontologies(declared)
        if ontology_changed:
            impacts.append({"impact": ONTOLOGY_INVALIDATED, "disposition": "applied"})
        if not impacts and fetched != old:
            impacts.append({"impact": SURFACE_CHANGED, "disposition": "informational"})
        if not digest_ok:
            impacts.append({"impact": SURFACE_CHANGED, "disposition": "informational", "defect": "revision-mismatch"})
        return ManifestChange(
            manifest=fetched,
            capabilities=new_capabilities,
            declared=declared,
            grant=new_grant,
            feature_sets=new_states,
            feature_sets_changed=new_states != states,
            ontology_changed=ontology_changed,
            impacts=impacts,
        )
