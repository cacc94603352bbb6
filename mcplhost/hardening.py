"""What the daemon does to itself so that its own children cannot read it (docs/operations.md#what-a-connector-can-still-reach).

A connector runs as the daemon's user. Without this, it could read
`/proc/<daemon pid>/environ` (the agents' api keys) or attach a debugger to
the daemon. Marking the daemon non-dumpable (Linux `PR_SET_DUMPABLE` 0)
makes its /proc files root's and refuses same-user ptrace. A child is not
affected: the flag is reset when it execs its own program. The cost is that
the daemon leaves no core dump. A leaf: it imports nothing of mcplhost.
"""

from __future__ import annotations

import ctypes
import sys

#: prctl(2) option numbers (linux/prctl.h).
PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


def refuse_inspection_by_same_user() -> bool:
    """Mark this process non-dumpable; False where that is not possible (not Linux, no prctl)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        status: int = libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # a C int: ctypes' default return type
        return status == 0
    except (OSError, AttributeError):
        return False
