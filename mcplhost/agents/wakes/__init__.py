"""Wakes: which stored item wakes which agent, and when (docs/agents.md#wakes, docs/agents.md#scheduling)."""
