"""JSON-RPC 2.0 over stdio: framing, messages, the request table and the session; every wire bound in limits.py."""

from .errors import ConnectionClosed, LineTooLong, RemoteError, ReplyError, RequestTimeout, error_for
from .framing import LineBuffer, Oversized
from .limits import MAX_LINE_BYTES, SessionLimits
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
    "MAX_LINE_BYTES", "SessionLimits", "LineBuffer", "Oversized",
    "INTERNAL_ERROR", "INVALID_PARAMS", "INVALID_REQUEST", "METHOD_NOT_FOUND", "PARSE_ERROR",
    "ErrorObject", "Deferred", "Session",
]
