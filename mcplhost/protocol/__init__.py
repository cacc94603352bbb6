"""MCPL semantics: grants, feature sets, authorization, channels, manifest digest, error codes."""

from mcplhost.protocol.digest import ManifestDigestError, manifest_digest
from mcplhost.protocol.grants import effective_grant

__all__ = ["ManifestDigestError", "effective_grant", "manifest_digest"]
