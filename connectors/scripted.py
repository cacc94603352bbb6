"""`python -m connectors.scripted` from a clone runs mcplhost.connectors.scripted."""

import runpy

runpy.run_module("mcplhost.connectors.scripted", run_name="__main__", alter_sys=True)
