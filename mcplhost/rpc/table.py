"""The table of our own outstanding requests, with no I/O.

We number our requests ourselves (1, 2, 3, ...); the peer's ids are a separate
space and never enter this table. A response is *matched* when its id is
outstanding, *late* when we already gave up on that id (timeout), and
*unknown* otherwise. Late ids are remembered in a bounded window only.
"""

from __future__ import annotations

from collections import OrderedDict
from enum import Enum
from typing import Any

#: How many abandoned ids we remember to tell "late" from "unknown".
LATE_MEMORY = 1024


class Settled(Enum):
    MATCHED = "matched"
    LATE = "late"
    UNKNOWN = "unknown"


class RequestTable:
    def __init__(self, late_memory: int = LATE_MEMORY) -> None:
        self._next_id = 1
        self._outstanding: dict[Any, str] = {}
        self._late: OrderedDict[Any, str] = OrderedDict()
        self._late_memory = late_memory

    def open(self, method: str) -> int:
        """Mint the id for a new request to `method` and record it."""
        request_id = self._next_id
        self._next_id += 1
        self._outstanding[request_id] = method
        return request_id

    def settle(self, request_id: Any) -> tuple[Settled, str | None]:
        """Classify a response's id; a matched id leaves the table."""
        # A str id never matches: we only ever mint ints ("1" is not 1).
        if type(request_id) is int:
            method = self._outstanding.pop(request_id, None)
            if method is not None:
                return Settled.MATCHED, method
            method = self._late.pop(request_id, None)
            if method is not None:
                return Settled.LATE, method
        return Settled.UNKNOWN, None

    def forget(self, request_id: int) -> None:
        """`request_id` was never sent: it leaves the table (an answer naming it is unknown)."""
        self._outstanding.pop(request_id, None)

    def abandon(self, request_id: int) -> None:
        """We stopped waiting for `request_id`; a later answer is late, not unknown."""
        method = self._outstanding.pop(request_id, None)
        if method is None:
            return
        self._late[request_id] = method
        while len(self._late) > self._late_memory:
            self._late.popitem(last=False)

    def close(self) -> list[int]:
        """The connection ended: every outstanding id, now abandoned."""
        ids = list(self._outstanding)
        for request_id in ids:
            self.abandon(request_id)
        return ids
