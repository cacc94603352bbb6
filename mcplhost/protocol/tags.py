"""Event tag expansion (SPEC §16.3).

Tags are a set of `namespace:value` claims on `push/event` params and
`channels/incoming` messages. They decide treatment only, after admission;
nothing here authorizes anything.

The host must apply the spec's core closure, and only the spec's: producer
`implies` edges count only when the operator has accepted that producer's
ontology, and then they are passed in explicitly. After expansion
`chat:addressed` wins over its opposite, `chat:ambient`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

ADDRESSED = "chat:addressed"
AMBIENT = "chat:ambient"

# SPEC §16.3, the normative core closure. Nothing else is core.
CORE_EDGES: Mapping[str, tuple[str, ...]] = {
    "chat:mention": (ADDRESSED,),
    "chat:reply": (ADDRESSED,),
    "chat:dm": (ADDRESSED, "chat:private"),
}


def is_namespaced(tag: str) -> bool:
    """Whether `tag` has the `namespace:value` form (a bare `mention` is not a tag)."""
    namespace, separator, value = tag.partition(":")
    return bool(namespace and separator and value)


def expand_tags(
    tags: Iterable[Any], accepted_implies: Mapping[str, Iterable[str]] | None = None
) -> list[str]:
    """The expanded tag set, sorted.

    Input order and duplicates are ignored. Core edges, plus any producer
    edges the operator accepted, are followed transitively and only ever add
    tags. Un-namespaced tags are kept but never start an edge, and an edge
    never adds one. Finally `chat:ambient` is removed if `chat:addressed` is
    present. Non-string entries are dropped.
    """
    if not tags:
        return []  # the common case: nothing to expand
    edges: Mapping[str, Iterable[str]] = CORE_EDGES
    if accepted_implies:
        merged = {source: set(targets) for source, targets in CORE_EDGES.items()}
        for source, targets in accepted_implies.items():
            merged.setdefault(source, set()).update(t for t in targets if isinstance(t, str))
        edges = merged

    expanded = {tag for tag in tags if isinstance(tag, str)}
    pending = [tag for tag in expanded if is_namespaced(tag)]
    while pending:
        for implied in edges.get(pending.pop(), ()):
            if is_namespaced(implied) and implied not in expanded:
                expanded.add(implied)
                pending.append(implied)

    if ADDRESSED in expanded:
        expanded.discard(AMBIENT)
    return sorted(expanded)


def producer_implies(feature_sets: Mapping[str, Any]) -> dict[str, list[str]]:
    """Every `tagOntology.tags.<t>.implies` edge the feature sets declare.

    `feature_sets` is the normalized, name-keyed form. Edges from several
    sets are merged. These are advisory: apply them (through
    `expand_tags(..., accepted_implies=...)`) only when the operator accepted
    the ontology (`accept_tag_implications = true`).
    """
    merged: dict[str, set[str]] = {}
    for declaration in feature_sets.values():
        ontology = declaration.get("tagOntology") if isinstance(declaration, dict) else None
        described = ontology.get("tags") if isinstance(ontology, dict) else None
        if not isinstance(described, dict):
            continue
        for tag, descriptor in described.items():
            implies = descriptor.get("implies") if isinstance(descriptor, dict) else None
            if isinstance(tag, str) and isinstance(implies, list):
                merged.setdefault(tag, set()).update(t for t in implies if isinstance(t, str))
    return {tag: sorted(targets) for tag, targets in sorted(merged.items())}
