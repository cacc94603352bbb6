"""Settings for the whole suite: Hypothesis judges what a property holds, never how long an example took.

A per-example deadline (Hypothesis's default is 200 ms) and the too-slow health
check are timings: on a machine busy with other work, or with the suite
spread over pytest-xdist workers, they fail a property that holds. Speed is
measured in tests/bench instead. Every other health check stays on.
"""

from __future__ import annotations

import compileall
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# A real PostgreSQL server per session and a fresh database per test that asks for one (tests/postgres.py).
from .postgres import postgres_db, postgres_server  # noqa: F401

REPO = Path(__file__).resolve().parents[1]

settings.register_profile("mcplhost", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mcplhost")


def pytest_configure(config: pytest.Config) -> None:
    """Compile the package once, before any test: the suite starts hundreds of daemon and connector processes,
    and with PYTHONDONTWRITEBYTECODE set (as on the machines it runs on) each would compile every module again.

    Only the controller (or a serial run) does it, before the pytest-xdist workers start. py_compile writes the
    bytecode whatever the environment says; a process only reads it.
    """
    if hasattr(config, "workerinput"):
        return
    for package in (REPO / "mcplhost", REPO / "connectors"):
        compileall.compile_dir(package, quiet=1)
