"""Errors the operator has to fix; each carries an `explanation` of what to do.

Only mcplhost/cli/ (its `main`) turns these into the single line on stderr.
"""

from __future__ import annotations


class OperatorError(Exception):
    """Something the operator must fix; `explanation` says how."""

    def __init__(self, message: str, explanation: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.explanation = explanation


class ConfigError(OperatorError):
    """The configuration file is missing, unreadable or invalid."""

    def __init__(self, message: str, explanation: str = "", *, problems: list[str] | None = None) -> None:
        super().__init__(message, explanation)
        self.problems = problems or []


class HostStateError(Exception):
    """The host broke its own invariants: a bug in mcplhost, never the connector's fault."""
