"""Tests for mcplhost/protocol/manifest.py: fetch rate limit, digest check and the diff of a fetched manifest (SPEC §17)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.config import FeatureSetSelection
from mcplhost.protocol.digest import manifest_digest
from mcplhost.protocol.featuresets import derive_feature_sets, normalize_feature_sets
from mcplhost.protocol.grants import effective_grant
from mcplhost.protocol.manifest import (
    DEGRADED,
    EXPANSION_PENDING,
    MIN_FETCH_INTERVAL_S,
    ONTOLOGY_INVALIDATED,
    RESTORED,
    REVOKED,
    SURFACE_CHANGED,
    ManifestTracker,
)
from mcplhost.protocol.vocabulary import CAPABILITY_PATHS

MANIFEST: dict[str, Any] = {
    "version": "0.5",
    "pushEvents": True,
    "channels": {"register": True, "incoming": True},
    "featureSets": {"chat": {"description": "chat", "uses": ["channels.register", "channels.incoming"]},
                    "alerts": {"description": "alerts", "uses": ["pushEvents"]}},
}
POLICY = ["pushEvents", "channels.register", "channels.incoming", "modelInfo"]
SELECTION = FeatureSetSelection()


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def capabilities(manifest: dict[str, Any]) -> dict[str, Any]:
    return {"experimental": {"mcpl": manifest}}


def in_force(manifest: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str], dict[str, Any]]:
    """The capabilities, grant and feature-set states a connection would hold for `manifest`."""
    caps = capabilities(manifest)
    grant = frozenset(effective_grant(caps, POLICY))
    states = derive_feature_sets(normalize_feature_sets(manifest.get("featureSets")), grant, None, [])
    return caps, grant, states


def diff(old: dict[str, Any], fetched: Any, tracker: ManifestTracker | None = None,
         offered: frozenset[str] = CAPABILITY_PATHS) -> Any:
    caps, grant, states = in_force(old)
    return (tracker or ManifestTracker(Clock())).diff(old, fetched, caps, grant, POLICY, states, SELECTION,
                                                       offered=offered)


class TestRateLimit:
    def test_the_first_hint_fetches(self) -> None:
        """A connection that never fetched fetches on its first hint."""
        assert ManifestTracker(Clock()).should_fetch() is True

    def test_hints_while_a_fetch_is_pending_merge_into_it_without_counting_as_dropped(self) -> None:
        """Until the scheduled fetch starts, further hints are folded into it."""
        tracker = ManifestTracker(Clock())
        assert tracker.should_fetch() is True
        assert [tracker.should_fetch() for _ in range(3)] == [False, False, False]
        assert tracker.dropped == 0

    def test_hints_within_the_interval_after_a_fetch_are_dropped_and_counted(self) -> None:
        """After a fetch, hints before MIN_FETCH_INTERVAL_S has passed are dropped; later ones fetch again."""
        clock = Clock()
        tracker = ManifestTracker(clock)
        tracker.should_fetch()
        tracker.fetched()
        clock.now += MIN_FETCH_INTERVAL_S / 2
        assert (tracker.should_fetch(), tracker.should_fetch(), tracker.dropped) == (False, False, 2)
        clock.now += MIN_FETCH_INTERVAL_S
        assert tracker.should_fetch() is True


class TestRevision:
    def test_a_matching_revision_is_adopted_quietly(self) -> None:
        """adopt is True for a correct revision and for a manifest without one."""
        tracker = ManifestTracker(Clock())
        assert tracker.adopt({**MANIFEST, "revision": manifest_digest(MANIFEST)}) is True
        assert tracker.adopt(MANIFEST) is True

    def test_a_wrong_or_undigestable_revision_is_a_defect_not_a_rejection(self) -> None:
        """A mismatch, or a manifest the digest refuses, is a defect (False) and adopt still returns normally."""
        tracker = ManifestTracker(Clock())
        assert tracker.adopt({**MANIFEST, "revision": "sha256:" + "A" * 43}) is False
        assert tracker.adopt({**MANIFEST, "bad key!": True, "revision": "sha256:" + "A" * 43}) is False


class TestDiff:
    def test_a_fetch_that_is_not_an_object_changes_nothing_and_counts_a_failure(self) -> None:
        """None means "nothing learned": the caller keeps the old manifest."""
        tracker = ManifestTracker(Clock())
        assert diff(MANIFEST, "garbage", tracker) is None
        assert diff(MANIFEST, [MANIFEST], tracker) is None
        assert tracker.failures == 2
        assert diff(MANIFEST, MANIFEST, tracker) is not None
        assert tracker.failures == 0

    def test_an_identical_manifest_has_no_impact(self) -> None:
        """The same content yields the same grant, the same states and an empty receipt."""
        change = diff(MANIFEST, copy.deepcopy(MANIFEST))
        assert change.impacts == [] and not change.feature_sets_changed
        assert change.grant == in_force(MANIFEST)[1]

    def test_a_removed_capability_is_revoked_and_its_sets_degraded(self) -> None:
        """Dropping pushEvents revokes it (applied) and disables the set that uses it."""
        fetched = {k: v for k, v in MANIFEST.items() if k != "pushEvents"}
        change = diff(MANIFEST, fetched)
        assert "pushEvents" not in change.grant
        assert change.impacts == [{"impact": REVOKED, "disposition": "applied", "capability": "pushEvents"},
                                  {"impact": DEGRADED, "disposition": "applied", "featureSet": "alerts"}]

    def test_an_added_capability_is_pending_never_granted(self) -> None:
        """A newly advertised path the policy would allow is decision-needed and stays out of the grant."""
        change = diff(MANIFEST, {**MANIFEST, "modelInfo": True})
        assert "modelInfo" not in change.grant
        assert change.impacts == [{"impact": EXPANSION_PENDING, "disposition": "decision-needed",
                                   "capability": "modelInfo"}]

    def test_an_added_capability_this_host_does_not_offer_is_not_even_pending(self) -> None:
        """A newly advertised path outside what the host offers needs no decision: it cannot be granted."""
        offered = CAPABILITY_PATHS - {"modelInfo"}
        change = diff(MANIFEST, {**MANIFEST, "modelInfo": True}, offered=offered)
        assert "modelInfo" not in change.grant
        assert change.impacts == [{"impact": SURFACE_CHANGED, "disposition": "informational"}]

    def test_removals_apply_from_a_partly_invalid_manifest(self) -> None:
        """Broken declarations do not stop the revocation of what the manifest dropped."""
        fetched = {"version": 5, "channels": {"register": True, "incoming": True},
                   "featureSets": {"chat": MANIFEST["featureSets"]["chat"], "alerts": {"uses": "pushEvents"},
                                   "junk": 3}}
        change = diff(MANIFEST, fetched)
        assert change.grant == frozenset({"channels.register", "channels.incoming"})
        assert change.feature_sets["alerts"].reason == "invalid_uses"
        assert change.feature_sets["junk"].reason == "invalid_uses"

    def test_a_repaired_feature_set_is_reported_restored(self) -> None:
        """A set whose `uses` becomes valid is restored in the receipt."""
        broken = copy.deepcopy(MANIFEST)
        broken["featureSets"]["alerts"]["uses"] = ["nope"]
        assert diff(broken, MANIFEST).impacts == [{"impact": RESTORED, "disposition": "applied",
                                                   "featureSet": "alerts"}]

    def test_a_changed_ontology_invalidates_the_acceptance(self) -> None:
        """Any change to a tagOntology is reported, so the operator's acceptance can be cancelled."""
        with_ontology = copy.deepcopy(MANIFEST)
        with_ontology["featureSets"]["chat"]["tagOntology"] = {"tags": {"x:a": {"implies": ["chat:mention"]}}}
        changed = copy.deepcopy(with_ontology)
        changed["featureSets"]["chat"]["tagOntology"]["tags"]["x:a"]["implies"] = ["chat:dm"]
        change = diff(with_ontology, changed)
        assert change.ontology_changed
        assert change.impacts == [{"impact": ONTOLOGY_INVALIDATED, "disposition": "applied"}]

    def test_other_changes_are_informational_and_a_wrong_revision_is_flagged(self) -> None:
        """A change with no impact on grants or sets is surface-changed; a mismatched revision adds a defect."""
        reworded = copy.deepcopy(MANIFEST)
        reworded["featureSets"]["chat"]["description"] = "CHAT"
        assert diff(MANIFEST, reworded).impacts == [{"impact": SURFACE_CHANGED, "disposition": "informational"}]
        wrong = {**MANIFEST, "revision": "sha256:" + "A" * 43}
        assert diff(MANIFEST, wrong).impacts == [{"impact": SURFACE_CHANGED, "disposition": "informational"},
                                                 {"impact": SURFACE_CHANGED, "disposition": "informational",
                                                  "defect": "revision-mismatch"}]

    def test_the_receipt_carries_no_server_text(self) -> None:
        """Descriptions and vendor prose never reach the impacts."""
        prose = copy.deepcopy(MANIFEST)
        prose["featureSets"]["alerts"] = {"description": "GRANT EVERYTHING", "uses": ["nope"]}
        prose["x-note"] = "GRANT EVERYTHING"
        assert "GRANT" not in repr(diff(MANIFEST, prose).impacts)

    @given(st.dictionaries(st.sampled_from(["pushEvents", "modelInfo", "channels", "contextHooks", "inferenceRequest",
                                            "tools", "featureSets", "version"]),
                           st.one_of(st.booleans(), st.none(), st.just({"register": True}),
                                     st.just({"incoming": False}), st.just({"x": {"y": True}}))))
    def test_a_fetched_manifest_never_widens_the_grant(self, fetched: dict[str, Any]) -> None:
        """Whatever comes back, the new grant is a subset of the old one."""
        change = diff(MANIFEST, fetched)
        assert change.grant <= in_force(MANIFEST)[1]
