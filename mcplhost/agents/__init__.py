"""Agents: who wakes for a stored item, what a turn sends to its model, and what it records (docs/agents.md)."""
