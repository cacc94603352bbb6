"""strip: drop host-only keys from a connector's metadata (docs/provenance.md §1).

A connector's `metadata` (channels/incoming) or `origin` (push/event) is
stored as `metadata.adapter`, its own keys as sent, apart from the host's
fields. On top of that namespacing, a key some reader of the host takes on
its own as what a message *is* (a notice, a draft, a held message, a stamp
of provenance) is dropped, so a connector's copy can never pass for the
host's. The caller logs each dropped key once per (server, key); this module
does no logging.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HOST_METADATA_KEYS", "strip_host_keys"]

# The keys only the host writes. `source` is not among them: connectors use
# `origin.source` legitimately (heartbeat's "heartbeat"), and the namespacing
# keeps it apart from the host's `metadata.source`.
HOST_METADATA_KEYS: frozenset[str] = frozenset(
    {
        "system",
        "kind",
        "draftOwner",
        "draftIds",
        "tuneOut",
        "coalescingSubject",
        "firstView",
        "deferredWriteId",
        "external",
        "openaiResponsesItems",
        "sourceHeader",
        "sourceBodyDigest",
        "storedBodyDigest",
        "inboundSource",
    }
)


def strip_host_keys(obj: dict[str, Any] | None) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A copy of `obj` without host keys, and the keys dropped, in `obj`'s order.

    `None` (the connector sent no object) gives an empty dict. Values are
    kept as sent, nested ones shared rather than copied.
    """
    if obj is None:
        return {}, ()
    if HOST_METADATA_KEYS.isdisjoint(obj):
        return dict(obj), ()
    kept = {key: value for key, value in obj.items() if key not in HOST_METADATA_KEYS}
    dropped = tuple(key for key in obj if key in HOST_METADATA_KEYS)
    return kept, dropped
