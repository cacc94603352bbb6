"""A host with its web console, run for a whole test module beside one Chromium (tests/console/browser.py).

    async with console_host(config, on_stored=hook) as host:     # in a task of its own, stopped on exit
        url = f"http://{host.console.address}"

The host runs in a task of its own, so a module-scoped fixture can keep it
between tests (a task group may not span a fixture's setup and teardown).
Logging is configured as `mcplhost run` does (JSON on stderr, info), so the
live feed sees the events dev's view shows; the previous setup is put back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import structlog

from mcplhost import logs
from mcplhost.cli.serve import console_lines
from mcplhost.config import Config
from mcplhost.host import Host, open_host
from mcplhost.store import NewItem

#: What every console page links to (the navigation).
NAV = {"/", "/feed", "/items", "/turns", "/outbox", "/drafts", "/search"}


@asynccontextmanager
async def console_host(config: Config, *, on_stored: Callable[[list[NewItem]], None] | None = None
                       ) -> AsyncIterator[Host]:
    saved = structlog.get_config()
    logs.configure("json", "info")
    stop = anyio.Event()
    opened: asyncio.Future[Host] = asyncio.get_running_loop().create_future()

    async def serve() -> None:
        try:
            async with open_host(config, on_stored=on_stored, feed_format=console_lines()) as host:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(host.run, stop)
                    with anyio.fail_after(30):
                        await host.ready.wait()
                    opened.set_result(host)
        except BaseException as exc:
            if not opened.done():
                opened.set_exception(exc)
            raise

    task = asyncio.get_running_loop().create_task(serve())
    try:
        yield await opened
    finally:
        stop.set()
        with anyio.fail_after(30):
            await task
        logs.shutdown()
        structlog.configure(**saved)


def header_problems(headers: dict[str, Any]) -> list[str]:
    """What a console response's headers lack of docs/operations.md#console's security headers."""
    found = []
    policy = headers.get("content-security-policy", "")
    if "default-src 'self'" not in policy or "unsafe-inline" in policy or "script-src 'self'" not in policy:
        found.append(f"content-security-policy: {policy!r}")
    if headers.get("x-frame-options") != "DENY":
        found.append(f"x-frame-options: {headers.get('x-frame-options')!r}")
    if headers.get("x-content-type-options") != "nosniff":
        found.append(f"x-content-type-options: {headers.get('x-content-type-options')!r}")
    return found


async def raw_http(address: str, request: str) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 exchange over a fresh connection (Connection: close): status, headers (lower-cased), body."""
    from ..harness import http_exchange

    answer = await http_exchange(address, request.encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body
