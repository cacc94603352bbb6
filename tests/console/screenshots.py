"""Screenshots of the web console for docs/ and the README: `python -m tests.console.screenshots`.

Runs `mcplhost dev --console` on a fresh database until the stubs have told
most of their story, then takes the overview, the live feed and an item's
page in headless Chromium (Debian's), at a laptop's width and, for the
overview, a phone's. Not a test: run it by hand when the pages change.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.async_api import async_playwright

from tests.console.browser import CHROMIUM, CHROMIUM_ARGS

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "images"
#: How long dev runs before the pictures: the stubs' scenario is about 30 s.
STORY_S = 34


async def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "dev.db"
        dev = subprocess.Popen([sys.executable, "-m", "mcplhost", "dev", "--console", "--seconds", str(STORY_S + 20),
                                "--db", str(db)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL, env={**os.environ, "NO_COLOR": "1"})
        address = None
        assert dev.stderr is not None
        for line in dev.stderr:
            found = re.search(r"web console: (http://\S+)", line)
            if found:
                address = found.group(1).rstrip("/")
                break
        assert address, "dev printed no console address"
        await asyncio.sleep(STORY_S)
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await page.goto(address + "/")
            await page.screenshot(path=OUT / "console-overview.png", full_page=True)
            await page.goto(address + "/feed")
            await page.screenshot(path=OUT / "console-feed.png")
            item = await page.locator("ol.feed li[data-kind=item] a", has_text="@scout").last.get_attribute("href")
            await page.goto(address + (item or "/items/1"))
            await page.screenshot(path=OUT / "console-item.png", full_page=True)
            phone = await browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
            await phone.goto(address + "/")
            await phone.screenshot(path=OUT / "console-phone.png")
            await browser.close()
        dev.terminate()
        dev.wait(30)
    print(f"wrote {', '.join(sorted(p.name for p in OUT.glob('console-*.png')))} into {OUT}")


if __name__ == "__main__":
    asyncio.run(main())
