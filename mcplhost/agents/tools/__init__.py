"""The tools an agent is offered, and calling them (docs/agents.md#tools)."""
