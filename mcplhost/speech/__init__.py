"""Speech: where what an agent says goes (routing, notices), and how it gets there (the outbox).

docs/agents.md#routing and #outbox. Importing this package imports none of its modules, so a
layer below (ingest, the store) may import one of them without a cycle;
`mcplhost.speech` must never import `mcplhost.agents` (agents import speech).
"""
