"""structlog configuration: JSON lines on stderr, or a console rendering for people.

Only the CLI calls `configure`; modules take `structlog.get_logger()` at import.
`mcplhost dev` passes a `tap` (its live view sees every event) and may hide
the log lines themselves (`show=False`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, Literal

import structlog

LogFormat = Literal["json", "console"]
Tap = Callable[[dict[str, Any]], None]


def configure(log_format: LogFormat = "json", level: str = "info", *, tap: Tap | None = None,
              show: bool = True) -> None:
    renderer: structlog.typing.Processor
    if log_format == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        renderer = structlog.processors.JSONRenderer()
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
    ]
    if tap is not None:
        processors.append(_tapping(tap))
    if not show:
        processors.append(_drop)
    processors += [
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def _tapping(tap: Tap) -> structlog.typing.Processor:
    def processor(logger: Any, method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
        tap(dict(event))
        return event

    return processor


def _drop(logger: Any, method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    raise structlog.DropEvent
