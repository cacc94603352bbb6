"""A connector's tools as offered to a model: named, marked and bounded, and what each costs (docs/agents.md#tools).

    verdict = connector_tool_spec("disc", "disc__search", listed)   # a ToolSpec, or why it is not offered
    tool_chars(spec)                                                # what it counts against `context_chars`

A connector's tool listing is untrusted text (docs/connectors.md §13): every
string of a description and `inputSchema` (keys included) is marked like a
body; a description is cut at TOOL_DESCRIPTION_MAX_CHARS; a schema longer
than TOOL_SCHEMA_MAX_BYTES as JSON, or nested deeper than
TOOL_SCHEMA_MAX_DEPTH, is not offered; the connector tools together take at
most 1/TOOLS_MAX_DIVISOR of the agent's `context_chars`. Pure: judged in a
worker thread.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Any

import msgspec

from mcplhost.agents.model import ToolSpec
from mcplhost.agents.tools.outcome import marked
from mcplhost.config import AgentConfig
from mcplhost.inbound.mark import has_opening
from mcplhost.protocol.answers import ListedTool

#: An agent's connector tools together take at most this share of `context_chars` (1/2); the rest are not offered.
TOOLS_MAX_DIVISOR = 2

_sorted_encoder = msgspec.json.Encoder(order="sorted")


def tool_chars(tool: ToolSpec) -> int:
    """What one offered tool counts against `context_chars`: its name, its description, its schema's JSON bytes."""
    return len(tool.name) + len(tool.description) + len(_sorted_encoder.encode(tool.input_schema))


#: `<connector>__<tool>`: what every backend accepts as a function name.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SEPARATOR = "__"
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
#: Longest connector tool description the model reads; the rest is cut, and the cut said.
TOOL_DESCRIPTION_MAX_CHARS = 4096
#: A connector tool whose `inputSchema` is longer than this as JSON (bytes) is not offered.
TOOL_SCHEMA_MAX_BYTES = 16 * 1024
#: ... nor one whose `inputSchema` nests deeper than this (objects and arrays).
TOOL_SCHEMA_MAX_DEPTH = 32
#: What follows a description cut at TOOL_DESCRIPTION_MAX_CHARS.
DESCRIPTION_CUT_NOTE = f" … (cut by the host at {TOOL_DESCRIPTION_MAX_CHARS} characters)"


def schema_problem(schema: Any) -> str | None:
    """Why a connector's `inputSchema` is not offered (too long as JSON, or nested too deep), or None.

    Bounded whatever the schema's size: the walk counts at least one byte
    per value it visits and stops once over TOOL_SCHEMA_MAX_BYTES, so only
    a schema already known to be small is encoded.
    """
    too_long = f"its inputSchema is longer than {TOOL_SCHEMA_MAX_BYTES} bytes as JSON"
    room = TOOL_SCHEMA_MAX_BYTES
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > TOOL_SCHEMA_MAX_DEPTH:
                return f"its inputSchema nests deeper than {TOOL_SCHEMA_MAX_DEPTH} levels"
            room -= 2  # its brackets
            members = value.items() if isinstance(value, dict) else enumerate(value)
            for key, member in members:
                room -= len(key) + 3 if isinstance(key, str) else 1  # a key, its quotes and colon; or a comma
                if room < 0:
                    return too_long  # before a million members are even looked at
                stack.append((member, depth + 1))
        else:
            room -= len(value) + 2 if isinstance(value, str) else 1
        if room < 0:
            return too_long
    try:
        encoded = msgspec.json.encode(schema)
    except (TypeError, ValueError, OverflowError):
        return "its inputSchema is not JSON"
    return too_long if len(encoded) > TOOL_SCHEMA_MAX_BYTES else None



def marked_json(value: Any) -> Any:
    """`value` with every string in it (object keys too) marked like a body; called on bounded schemas only."""
    if isinstance(value, str):
        return marked(value) if has_opening(value) else value
    if isinstance(value, dict):
        return {marked_json(key): marked_json(member) for key, member in value.items()}
    if isinstance(value, list):
        return [marked_json(member) for member in value]
    return value



def connector_tool_spec(connector: str, name: str, tool: ListedTool) -> ToolSpec | str:
    """How a connector's MCP tool is offered as `name`: marked and bounded; or why it is not offered."""
    schema = tool.inputSchema
    if schema is not None:
        problem = schema_problem(schema)
        if problem is not None:
            return problem
        schema = marked_json(schema)
    else:
        schema = EMPTY_SCHEMA
    description = tool.description
    shown = marked(description[:TOOL_DESCRIPTION_MAX_CHARS])
    if len(description) > TOOL_DESCRIPTION_MAX_CHARS:
        shown += DESCRIPTION_CUT_NOTE
    return ToolSpec(name=name, description=f"({connector}) {shown}".strip(), input_schema=schema)



def judge_listed(connector: str, name: str, tool: ListedTool) -> tuple[ToolSpec | str, int]:
    """One listed tool as offered (its spec and its chars), or why it is not (pure: safe in a worker thread)."""
    verdict = connector_tool_spec(connector, name, tool)
    return verdict, 0 if isinstance(verdict, str) else tool_chars(verdict)



def offered(agent: AgentConfig, name: str) -> bool:
    """Whether the agent's `tools` globs let it have the tool called `name` (no `tools`: every tool)."""
    return agent.tools is None or any(fnmatchcase(name, glob) for glob in agent.tools)
