"""`python -m connectors.heartbeatish` from a clone runs mcplhost.connectors.heartbeatish."""

import runpy

runpy.run_module("mcplhost.connectors.heartbeatish", run_name="__main__", alter_sys=True)
