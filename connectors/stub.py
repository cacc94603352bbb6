"""`python -m connectors.stub` from a clone runs mcplhost.connectors.stub."""

import runpy

runpy.run_module("mcplhost.connectors.stub", run_name="__main__", alter_sys=True)
