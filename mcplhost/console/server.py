"""Hypercorn's settings for the console: the bounds of a connection, and the security headers on every response.

Hypercorn writes a few responses itself (a 400 for a request it cannot
parse, a 431 for a head that is too long); `SecuredConfig` puts the
console's SECURITY_HEADERS on those and on every response the app makes,
once, so no response of the console is without them (docs/operations.md#console).
The guard (guard.py) removes any copy a page sets, so none is doubled.
"""

from __future__ import annotations

from hypercorn.config import Config

from .guard import SECURITY_HEADERS

#: Pending connections the kernel holds for the console.
BACKLOG = 64
#: A request head (request line and headers) is at most this long (h11 and nginx allow 8 KiB and more).
MAX_HEAD_BYTES = 16 * 1024
#: A connection with no request in flight is closed after this long (a slow head counts as none).
KEEP_ALIVE_S = 5.0
#: How long open connections get to finish when the host stops (then Hypercorn cancels them).
SHUTDOWN_GRACE_S = 1.0


class SecuredConfig(Config):
    """Hypercorn's Config, whose headers for every response include the console's security headers."""

    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        return [*super().response_headers(protocol), *SECURITY_HEADERS]


def server_config(descriptor: int) -> Config:
    """Serve the listening socket `descriptor` (Hypercorn closes it), HTTP/1.1 only, nothing logged."""
    config = SecuredConfig()
    config.bind = [f"fd://{descriptor}"]
    config.accesslog = None  # no request line is logged: a sign-in's body never is either
    config.errorlog = None
    config.include_server_header = False
    config.graceful_timeout = SHUTDOWN_GRACE_S
    config.keep_alive_timeout = KEEP_ALIVE_S
    config.h11_max_incomplete_size = MAX_HEAD_BYTES
    config.backlog = BACKLOG
    config.alpn_protocols = ["http/1.1"]
    return config
