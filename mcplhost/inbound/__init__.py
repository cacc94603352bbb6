"""Inbound provenance: pure functions over plain data (docs/provenance.md).

Every item a connector delivers passes strip → freeze-source → header →
mark before it is stored, with digests of the body as delivered and as
stored. Nothing in this package does I/O, reads a clock or a config, or
logs; `pipeline.run_pipeline` composes the stages for the host.
"""

from mcplhost.inbound.digest import body_digest, canonical_json
from mcplhost.inbound.header import render_source_header
from mcplhost.inbound.mark import mark_openings
from mcplhost.inbound.quoting import header_value, label_value, quoted
from mcplhost.inbound.strip import HOST_METADATA_KEYS, strip_host_keys

__all__ = [
    "HOST_METADATA_KEYS",
    "body_digest",
    "canonical_json",
    "header_value",
    "label_value",
    "mark_openings",
    "quoted",
    "render_source_header",
    "strip_host_keys",
]
