"""`JsonObject`: a JSON object the host builds to send or to keep, named as such.

A function returning one builds JSON-RPC params or a result going onto the wire, a model
provider's request, a stored row's JSON, or an export's object (the status, a tool's answer to the
model). Data handed between the host's own layers is a msgspec Struct instead (docs/architecture.md#types).
"""

from __future__ import annotations

from typing import Any, TypeAlias

__all__ = ["JsonObject"]

JsonObject: TypeAlias = dict[str, Any]
