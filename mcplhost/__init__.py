"""mcplhost: a long-running host for MCPL connectors."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mcplhost")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
