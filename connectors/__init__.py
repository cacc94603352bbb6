"""Connectors shipped with mcplhost, each run as ``python -m connectors.<name>``.

They speak MCPL as a server on stdin/stdout through `connectors.mcpl_server`
and use only the standard library, so they double as examples for people
writing their own connector.
"""
