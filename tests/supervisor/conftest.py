"""Supervisor test fixtures: every structlog event of a test, time-stamped on the connectors' clock."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs


def _stamp(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    event["t"] = time.monotonic()  # the clock the scripted connectors record with
    return event


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    """The test's structlog events as dicts, each with `t` (time.monotonic() when it was logged)."""
    with capture_logs(processors=[_stamp]) as captured:
        yield captured
