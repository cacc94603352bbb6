"""A Unix socket path the kernel accepts, however deep the state directory is.

A socket's address is limited to about 108 bytes (`sun_path`). A longer
path is reached through the folder's descriptor, `/proc/self/fd/N/NAME`
(Linux), which names the same file in a few bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Longest socket path used as it is (sun_path holds 108 bytes, its last one the terminating NUL).
MAX_SOCKET_PATH_BYTES = 100


@contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """`path` as an address bind and connect accept, valid inside the `with`."""
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH_BYTES:
        yield str(path)
        return
    folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{folder}/{path.name}"
    finally:
        os.close(folder)
