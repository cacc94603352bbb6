"""Connectors shipped with mcplhost, each run as ``mcplhost connector NAME``
(or ``python -m mcplhost.connectors.NAME``).

They speak MCPL as a server on stdin/stdout through `mcpl_server` and use
only the standard library and relative imports, never mcplhost's internals,
so they double as examples for people writing their own connector.
"""
