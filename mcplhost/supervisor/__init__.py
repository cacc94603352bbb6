"""The supervisor: one owner task per connector (supervise.py) and the handle the rest of the host reads it through.

Importing this package imports none of its modules; each caller names the module it needs (docs/architecture.md#layers).
"""
