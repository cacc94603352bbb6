"""mcplhost: a long-running host for MCPL connectors.

`__version__` is looked up when first read, not on import: finding it loads importlib.metadata (~75 ms),
and the command keeps the moments before its Ctrl-C handling starts short (mcplhost/__main__.py).
"""


def __getattr__(name: str) -> str:
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("mcplhost")
    except PackageNotFoundError:  # running from a source tree that was never installed
        found = "0.0.0+unknown"
    globals()["__version__"] = found
    return found
