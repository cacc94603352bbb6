"""A console off loopback, in headless Chromium: every visitor signs in with the token, and the restart action.

One host for the module: `[console] listen = "0.0.0.0:0"` (visited on
127.0.0.1: a loopback visitor needs the token too), a token file of mode
0600, and `actions = ["restart-connector"]`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import anyio
import pytest
import pytest_asyncio
from playwright.async_api import Browser

from mcplhost.config import ConsoleConfig
from mcplhost.console.access import COOKIE
from mcplhost.host import Host

from ..harness import CHAT_GRANT, CHAT_MANIFEST, config_with, scripted
from .browser import chromium
from .support import console_host, header_problems, raw_http

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "9d3c0b1e5f7a2468ace0135792468bdf"


class Running:
    def __init__(self, host: Host, browser: Browser) -> None:
        self.host = host
        self.browser = browser
        assert host.console is not None and host.console.address is not None
        self.port = host.console.address.rsplit(":", 1)[1]
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Running]:
    folder = tmp_path_factory.mktemp("signin")
    token = folder / "console.token"
    token.write_text(TOKEN + "\n", encoding="utf-8")
    os.chmod(token, 0o600)
    config = config_with(folder, scripted("quiet", {"manifest": CHAT_MANIFEST}, folder, grant=CHAT_GRANT))
    config = type(config)(store=config.store, connectors=config.connectors, console=ConsoleConfig(
        listen="0.0.0.0:0", token_file=str(token), actions=["restart-connector"]))
    async with console_host(config) as host, chromium() as browser:
        yield Running(host, browser)


class TestSignIn:
    async def test_a_visitor_without_the_token_is_refused(self, running: Running) -> None:
        """Every page sends a visitor to the sign-in form (a password input); the live streams and the action
        are refused outright; a wrong token is refused; only the static files are served without one."""
        page = await running.browser.new_page()
        for path in ("/", "/items", "/feed", "/turns/1"):
            await page.goto(running.url + path)
            assert page.url == running.url + "/signin", path
            assert await page.locator("form[action='/signin'] input[type=password]").count() == 1
        await page.fill("input[type=password]", "not-the-token-at-all")
        async with page.expect_response(lambda r: r.request.method == "POST") as posted:
            await page.click("button[type=submit]")
        assert (await posted.value).status == 403
        assert await page.locator(".error").text_content() == "That is not the console's token."
        assert await page.context.cookies() == []
        await page.close()
        for request, status in (("GET /feed/events HTTP/1.1", 403), ("GET /status/events HTTP/1.1", 403),
                                ("POST /connectors/quiet/restart HTTP/1.1", 403), ("GET /items/1 HTTP/1.1", 303),
                                ("GET /static/console.css HTTP/1.1", 200)):
            answer = await raw_http(running.address, f"{request}\r\nHost: {running.address}\r\n"
                                    "Content-Length: 0\r\nConnection: close\r\n\r\n")
            assert answer[0] == status, request
            assert not header_problems(answer[1])

    async def test_signing_in_once_gives_a_strict_http_only_session(self, running: Running) -> None:
        """The right token leads to the overview and a session cookie no script can read and no other site's
        request carries; it is not the token, and the pages that follow need no second sign-in."""
        context = await running.browser.new_context()
        page = await context.new_page()
        await page.goto(running.url + "/")
        await page.fill("input[type=password]", TOKEN)
        await page.click("button[type=submit]")
        await page.wait_for_url(running.url + "/")
        (cookie,) = await context.cookies()
        assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"]) == (COOKIE, True, "Strict")
        assert TOKEN not in cookie["value"] and await page.evaluate("document.cookie") == ""
        await page.goto(running.url + "/items")
        assert page.url == running.url + "/items" and TOKEN not in await page.content()
        await context.close()


class TestRestart:
    async def test_the_restart_button_restarts_its_connector(self, running: Running) -> None:
        """Signed in, the connector's card has a "restart" button; pressing it restarts that connector; the
        same POST without this session's CSRF token is refused."""
        context = await running.browser.new_context()
        page = await context.new_page()
        await page.goto(running.url + "/signin")
        await page.fill("input[type=password]", TOKEN)
        await page.click("button[type=submit]")
        await page.wait_for_url(running.url + "/")
        handle = running.host.connectors["quiet"]
        before = handle.statistics().restarts
        card = page.locator("article[data-kind=connectors][data-name=quiet]")
        await card.get_by_role("button", name="restart").click()
        await page.wait_for_url(running.url + "/?restarted=quiet")
        assert await page.locator(".notice").text_content() == "Asked quiet to restart."
        with anyio.fail_after(20):
            while handle.statistics().restarts <= before:
                await anyio.sleep(0.02)
        (cookie,) = await context.cookies()
        forged = "csrf=guessed"
        answer = await raw_http(running.address, f"POST /connectors/quiet/restart HTTP/1.1\r\nHost: {running.address}"
                                f"\r\nCookie: {COOKIE}={cookie['value']}\r\nContent-Length: {len(forged)}\r\n"
                                f"Content-Type: application/x-www-form-urlencoded\r\nConnection: close\r\n\r\n{forged}")
        assert answer[0] == 403
        await context.close()
