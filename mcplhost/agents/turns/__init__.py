"""One agent turn and its reply path: the compiled request, the hooks, the record, the speech (docs/agents.md#turns)."""
