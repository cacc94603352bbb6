"""Exceptions of the JSON-RPC layer, one per situation."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from .messages import INTERNAL_ERROR, ErrorObject


class ReplyError(Exception):
    """Raised by a request handler: answer the request with this error object."""

    def __init__(self, code: int, message: str, data: Any = UNSET) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class RemoteError(Exception):
    """The peer answered one of our requests with an error object."""

    def __init__(self, error: ErrorObject) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.code = error.code
        self.message = error.message
        self.data = error.data


class ConnectionClosed(Exception):
    """The peer's output ended (or our writes fail) while a request was outstanding."""


class LineTooLong(Exception):
    """A message of ours would be a line longer than the cap; it was not written (nothing of it was)."""

    def __init__(self, method: str, size: int, limit: int) -> None:
        super().__init__(f"{method} not sent: its line would be {size} bytes, over the {limit}-byte line cap")
        self.method = method
        self.size = size
        self.limit = limit


class RequestTimeout(TimeoutError):
    """The peer did not answer one of our requests in time."""

    def __init__(self, method: str, timeout: float, request_id: int | None = None) -> None:
        super().__init__(f"no answer to {method} within {timeout:g} s")
        self.method = method
        self.timeout = timeout
        self.request_id = request_id  # ours, for an MCP notifications/cancelled naming it


def error_for(exc: BaseException) -> ErrorObject:
    """The one place a handler's exception becomes a wire error."""
    if isinstance(exc, ReplyError):
        return ErrorObject(exc.code, exc.message, exc.data)
    # Never leak a traceback or our internals to a connector.
    return ErrorObject(INTERNAL_ERROR, "internal error", {"type": type(exc).__name__})
