"""Headless Chromium for the console's browser tests: Debian's `chromium`, driven by Playwright, a fresh profile.

No browser is downloaded: Playwright is pointed at the system's binary
(.ci/run installs the `chromium` package where it is missing). When it
cannot start, a test fails in CI (CI=true) and is skipped elsewhere, with
the reason.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from playwright.async_api import Browser, Error, async_playwright

CHROMIUM = "/usr/bin/chromium"
#: Headless, no sandbox (CI runs as root), nothing that would reach the network by itself.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """A launched Chromium (each launch a fresh temporary profile), closed on exit."""
    async with async_playwright() as playwright:
        try:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Error as exc:
            reason = f"Chromium ({CHROMIUM}) cannot start: {str(exc).splitlines()[0]}"
            if os.environ.get("CI") == "true":
                pytest.fail(reason)
            pytest.skip(reason)
        try:
            yield browser
        finally:
            await browser.close()
