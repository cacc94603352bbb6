"""`python -m connectors.NAME` from a clone: the bundled connectors, kept for that spelling.

The code lives in `mcplhost.connectors` (the name the wheel installs); each
module here only runs its namesake there.
"""
