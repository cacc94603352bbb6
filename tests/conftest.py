"""Settings for the whole suite: the Hypothesis profile (tests/properties.py), the package compiled once, Ctrl-C's
default handling, and how pytest-xdist hands the files out."""

from __future__ import annotations

import compileall
import signal
import sys
from pathlib import Path
from typing import Any

# Before anything imports structlog: where rich is installed (import-linter brings it into the dev environment)
# structlog's default chain, which a test's in-process host logs through, draws each logged exception's traceback
# with rich, at about 0.1 s of CPU apiece; refused, it prints the plain traceback. The mcplhost command refuses
# it too (mcplhost/__main__.py), so both log the same way.
sys.modules.setdefault("rich", None)  # type: ignore[arg-type]  # None: `import rich` raises ImportError

import pytest

from . import properties

# A real PostgreSQL server per session and a fresh database per test that asks for one (tests/postgres.py).
from .postgres import postgres_db, postgres_server  # noqa: F401

REPO = Path(__file__).resolve().parents[1]

properties.load()

# Ctrl-C's default handling in every process of the suite, whatever started it: a shell without job control starts
# a background job (`pytest &`, as a CI script may) with SIGINT and SIGQUIT ignored, and a child inherits an ignored
# signal; a daemon or `messages --follow` a test sends SIGINT would then ignore it and the test fail at its bound,
# depending on the order the tests ran in (an in-process `run` restores the handler as it ends).
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGQUIT, signal.SIG_DFL)

# pytest keeps each test module's assertion-rewritten bytecode in __pycache__ only where bytecode may be
# written; with PYTHONDONTWRITEBYTECODE set (as on the machines the suite runs on) every worker would parse,
# rewrite and compile all ~280 test modules again on every run, about 10 s of CPU each. This process's own
# imports write it from here on (the test modules are imported after this file); children keep the variable.
sys.dont_write_bytecode = False


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


#: Test files that load a model SDK in the test process (the openai SDK costs ~1.3 s of CPU to import, anthropic's
#: ~3 s): scheduled as one unit, so one pytest-xdist worker imports them instead of each.
MODEL_SDK_FOLDER = "tests/agents/backends/"
MODEL_SDK_FILES = frozenset({
    "tests/agents/test_author_line.py", "tests/agents/test_failure_reply.py", "tests/agents/test_moderation.py",
    "tests/agents/test_reload.py", "tests/agents/test_stop.py", "tests/protocol/test_inference_wire.py",
    "tests/speech/test_moderation.py",
})


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist hands out whole files (as `--dist loadfile`), and the model-SDK files above as one unit.

    Whole files keep a file's module-scoped setup and lazily imported libraries on one worker; with `-n 3` on
    2 cores it measured 185 s against 190 s for test-by-test scheduling (`--dist load`).
    """
    from xdist.scheduler import LoadFileScheduling

    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "model SDKs" if path.startswith(MODEL_SDK_FOLDER) or path in MODEL_SDK_FILES else path

    return FileScheduling(config, log)
