"""What an offered tool costs: the share of `context_chars` the connector tools may take (docs/agents.md#tools)."""

from __future__ import annotations

import msgspec

from mcplhost.agents.model import ToolSpec

#: An agent's connector tools together take at most this share of `context_chars` (1/2); the rest are not offered.
TOOLS_MAX_DIVISOR = 2

_sorted_encoder = msgspec.json.Encoder(order="sorted")


def tool_chars(tool: ToolSpec) -> int:
    """What one offered tool counts against `context_chars`: its name, its description, its schema's JSON bytes."""
    return len(tool.name) + len(tool.description) + len(_sorted_encoder.encode(tool.input_schema))
