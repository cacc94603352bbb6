"""Where one connection stands, and the two ways its MCPL life can end early."""

from __future__ import annotations

from enum import Enum


class Mode(Enum):
    HANDSHAKE = "handshake"
    POLICY_PENDING = "policy_pending"
    READY = "ready"
    MCP_ONLY = "mcp_only"
    CLOSED = "closed"  # refused a later policy with fallback "close": nothing is served any more


class PolicyClosed(Exception):
    """The connector refused our policy with fallback "close" (or we chose to close)."""


class HandshakeFailed(Exception):
    """`initialize` failed: no answer, an error, or an unusable result."""
