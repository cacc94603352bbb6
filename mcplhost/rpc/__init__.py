"""JSON-RPC 2.0 over stdio: framing, messages, the request table and the session."""

from .errors import ConnectionClosed, LineTooLong, RemoteError, ReplyError, RequestTimeout, error_for
from .framing import MAX_LINE_BYTES, LineBuffer, Oversized
from .messages import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    ErrorObject,
)
from .session import Deferred, Session

__all__ = [
    "ConnectionClosed", "LineTooLong", "RemoteError", "ReplyError", "RequestTimeout", "error_for",
    "MAX_LINE_BYTES", "LineBuffer", "Oversized",
    "INTERNAL_ERROR", "INVALID_PARAMS", "INVALID_REQUEST", "METHOD_NOT_FOUND", "PARSE_ERROR",
    "ErrorObject", "Deferred", "Session",
]
