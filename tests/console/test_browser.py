"""The web console in headless Chromium, against a host whose connector is hostile (docs/operations.md#console).

One host and one browser for the module. The connector `evil` registers a
channel whose label is markup, and sends a message whose author name and
body are markup and `javascript:` links; then an addressed message that
wakes scout, one more from the same sender that scout's per-sender cap
holds, an ambient one that wakes nobody, and, when the test asks, a live one.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page

from mcplhost.config import AgentConfig, BackendConfig, ConsoleConfig
from mcplhost.dev import config_toml
from mcplhost.host import Host
from mcplhost.rpc import RemoteError
from mcplhost.store import NewItem, StoredItem

from ..builders import incoming, message
from ..cli.support import cli
from ..harness import CHAT_GRANT, CHAT_MANIFEST, config_with, count_rows, scripted, stored_items
from .browser import chromium
from .support import NAV, console_host, header_problems, raw_http

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOM = "evil:g1:room"
#: Each sets window.__pwned if it ever runs.
LABEL = '<script>window.__pwned="label"</script>"><svg onload=window.__pwned="label-svg">'
AUTHOR = '<img src=x onerror=window.__pwned="author">'
BODY = ('<script>window.__pwned="body"</script> "><svg onload=window.__pwned="svg"> '
        '<img src=x onerror=window.__pwned="img"> [click](javascript:window.__pwned="md") '
        '<a href="javascript:window.__pwned=1">a link</a> javascript:window.__pwned="bare"')
LIVE = "a live line for the feed"
PUBLISHED = {"result": {"delivered": True, "messageId": "sent-1"}}


ALICE = {"id": "u-alice", "name": "Alice"}


STEPS = [
    {"request": "channels/register", "params": {"channels": [
        {"id": ROOM, "type": "evil", "direction": "bidirectional", "address": {}, "label": LABEL}]}},
    incoming(message(ROOM, "m-hostile", BODY, author={**ALICE, "name": AUTHOR}, tags=["chat:ambient"])),
    incoming(message(ROOM, "m-woken", "scout, say hi", author=ALICE, tags=["chat:addressed"])),
    {"wait": "channels/publish"},
    incoming(message(ROOM, "m-held", "scout, once more", author=ALICE, tags=["chat:addressed"])),
    incoming(message(ROOM, "m-quiet", "just chatting", author=ALICE, tags=["chat:ambient"])),
    {"wait": "test/next"},
    incoming(message(ROOM, "m-live", LIVE, author=ALICE, tags=["chat:ambient"])),
]


class Running:
    """The module's host, browser and what the test needs to find again."""

    def __init__(self, host: Host, browser: Browser, folder: Path, committed: dict[str, float],
                 live_committed: anyio.Event) -> None:
        self.host = host
        self.browser = browser
        self.folder = folder
        self.committed = committed
        self.live_committed = live_committed
        assert host.console is not None and host.console.address is not None
        self.address = host.console.address
        self.url = f"http://{self.address}"
        self.items: dict[str, StoredItem] = {}

    async def load_items(self) -> None:
        self.items = {i.metadata.get("messageId"): i for i in await stored_items(self.folder) if i.agent is None}

    def id(self, message_id: str) -> int:
        return self.items[message_id].id


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Running]:
    folder = tmp_path_factory.mktemp("console")
    connector = scripted("evil", {"manifest": CHAT_MANIFEST, "steps": STEPS,
                                  "handlers": {"channels/publish": PUBLISHED}}, folder,
                         grant=[*CHAT_GRANT, "channels.publish"])
    agent = AgentConfig(name="scout", wake_on=["addressed"], debounce_ms=0, max_wait_ms=0,
                        max_wakes_per_sender_per_hour=1,
                        backend=BackendConfig(kind="scripted", script=["you said: {{echo}}"]))
    config = config_with(folder, connector)
    config = type(config)(store=config.store, connectors=config.connectors, agents=[agent],
                          console=ConsoleConfig(listen="127.0.0.1:0"))
    (folder / "mcplhost.toml").write_text(config_toml(config), encoding="utf-8")
    committed: dict[str, float] = {}
    live_committed = anyio.Event()

    def on_stored(items: list[NewItem]) -> None:
        for item in items:
            committed[str(item.metadata.get("messageId"))] = time.monotonic()
            if item.metadata.get("messageId") == "m-live":
                live_committed.set()

    db = folder / "host.db"
    async with console_host(config, on_stored=on_stored) as host, chromium() as browser:
        with anyio.fail_after(30):  # the story up to the live step: a turn, its publish, a held wake
            while not (count_rows(db, "wake_decisions") and count_rows(db, "items", "agent IS NULL") >= 4
                       and count_rows(db, "turns", "ended_at IS NOT NULL")):
                await anyio.sleep(0.02)
        run = Running(host, browser, folder, committed, live_committed)
        await run.load_items()
        yield run


async def visit(run: Running, path: str) -> tuple[Page, list[str]]:
    """A new page at `path`, with every console error, page error and dialog it had."""
    page = await run.browser.new_page()
    errors = listen(page)
    response = await page.goto(run.url + path)
    assert response is not None and response.status == 200, (path, response and response.status)
    return page, errors


def listen(page: Page) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("dialog", lambda d: errors.append(f"dialog: {d.message}"))
    return errors


def pages(run: Running) -> list[str]:
    """A page of each kind, those showing the hostile item among them."""
    return ["/", "/feed", "/items", f"/items/{run.id('m-hostile')}", f"/items/{run.id('m-woken')}", "/turns",
            "/turns/1", "/outbox", "/drafts", "/search?q=window", "/items?connector=evil", f"/items?channel={ROOM}",
            "/turns?agent=scout"]


class Report(msgspec.Struct):
    """What one page was, seen by the browser."""

    status: int
    errors: list[str]
    links: set[str]
    pwned: Any  # window.__pwned: None unless a planted script ran
    scripts: list[str]  # the src of every script element
    handlers: int  # elements with an onload or onerror attribute
    images: int
    javascript_links: int
    text: str  # what <main> reads as


#: Every page's report, and every response the walk saw (url, headers), in one walk of one tab.
Walk = tuple[dict[str, Report], list[tuple[str, dict[str, str]]]]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def walk(running: Running) -> Walk:
    page = await running.browser.new_page()
    errors = listen(page)
    responses: list[tuple[str, dict[str, str]]] = []
    page.on("response", lambda r: responses.append((r.url, r.headers)))
    reports = {}
    for path in pages(running):
        errors.clear()
        response = await page.goto(running.url + path)
        seen = await page.evaluate("""() => ({
            links: Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href')),
            pwned: window.__pwned === undefined ? null : String(window.__pwned),
            scripts: Array.from(document.scripts).map(s => s.getAttribute('src')),
            handlers: document.querySelectorAll('[onload],[onerror]').length,
            images: document.querySelectorAll('img').length,
            javascript_links: Array.from(document.querySelectorAll('a[href]'))
                .filter(a => a.href.trim().toLowerCase().startsWith('javascript:')).length,
            text: document.querySelector('main').innerText})""")
        reports[path] = Report(status=response.status if response else 0, errors=list(errors),
                               links=set(seen.pop("links")), **seen)
    await page.goto(running.url + "/outbox/1")  # a redirect to its turn
    await page.goto(running.url + "/no-such-page")
    await page.close()
    return reports, responses


class TestPages:
    async def test_every_page_loads_without_errors_and_links_to_the_others(self, running: Running,
                                                                          walk: Walk) -> None:
        """Each page answers 200 with no console error and the navigation to every other page; the overview
        links to the agents' and connectors' pages, the feed to the item page."""
        reports, _ = walk
        for path, report in reports.items():
            assert report.status == 200 and not report.errors, (path, report.status, report.errors)
            assert NAV <= report.links, (path, NAV - report.links)
        assert {"/turns?agent=scout", "/items?connector=evil"} <= reports["/"].links
        assert f"/items/{running.id('m-hostile')}" in reports["/feed"].links

    async def test_each_connector_and_agent_has_its_state_word(self, running: Running) -> None:
        """A card per connector and per agent, its state spelled as `status --json` spells it."""
        page, _ = await visit(running, "/")
        state = await page.locator("article[data-kind=connectors][data-name=evil] [data-field=state]").text_content()
        agent = await page.locator("article[data-kind=agents][data-name=scout] [data-field=state]").text_content()
        await page.close()
        assert state == running.host.connectors["evil"].statistics().state.value == "ready"
        assert agent in ("idle", "debouncing", "in_turn")


class TestHostileText:
    async def test_markup_from_a_connector_renders_as_text_and_never_runs(self, running: Running,
                                                                         walk: Walk) -> None:
        """Label, author and body are shown as the text they are; no script, handler or javascript: link of
        theirs exists on any page, and none ran."""
        reports, _ = walk
        for path, report in reports.items():
            assert report.pwned is None and not report.errors, (path, report.pwned, report.errors)
            assert report.scripts == ["/static/console.js"], path
            assert (report.handlers, report.images, report.javascript_links) == (0, 0, 0), path
        stored = running.items["m-hostile"]
        text = reports[f"/items/{stored.id}"].text
        assert BODY in text and AUTHOR in text and stored.metadata["source"]["label"] in text
        for path in ("/feed", "/items", "/search?q=window"):
            assert '<script>window.__pwned="body"</script>' in reports[path].text, path


class TestHeaders:
    async def test_every_response_carries_the_security_headers(self, running: Running, walk: Walk) -> None:
        """Pages, static files, the live streams, redirects and refusals: CSP, X-Frame-Options, nosniff."""
        _, seen = walk
        urls = [url for url, _ in seen]
        assert any(url.endswith("/static/console.js") for url in urls) and any("/feed/events" in url for url in urls)
        assert any(url.endswith("/outbox/1") for url in urls) and any(url.endswith("/no-such-page") for url in urls)
        for url, headers in seen:
            assert not header_problems(headers), (url, header_problems(headers))
        requests = ["GET /items/999999 HTTP/1.1\r\nHost: 127.0.0.1\r\n",  # 404
                    "GET / HTTP/1.1\r\nHost: rebound.example\r\n",  # 421: not a loopback name
                    "POST /connectors/evil/restart HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n",  # 403
                    "POST /signin HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999\r\n",  # 413
                    "GET /\x00 HTTP/1.1\r\nHost: 127.0.0.1\r\n"]  # 400, from the server itself
        statuses = []
        for request in requests:
            status, headers, _ = await raw_http(running.address, request + "Connection: close\r\n\r\n")
            statuses.append(status)
            assert not header_problems(headers), (request, header_problems(headers))
        assert statuses == [404, 421, 403, 413, 400]


class TestFeed:
    async def test_a_new_item_shows_within_a_second_of_its_commit(self, running: Running) -> None:
        """With the feed open, the connector sends one more message: its line is on top within 1 s of its commit."""
        page, errors = await visit(running, "/feed")
        console = running.host.console
        assert console is not None
        with anyio.fail_after(10):
            while console.feed.subscribers < 1:  # the page's EventSource has connected
                await anyio.sleep(0.01)
        try:
            await running.host.connectors["evil"].request("test/next", {})
        except RemoteError:
            pass  # the scripted connector does not know the method; its "wait" step goes on all the same
        with anyio.fail_after(10):
            await running.live_committed.wait()
        left = 1.0 - (time.monotonic() - running.committed["m-live"])
        line = page.locator("ol.feed li").first
        await line.filter(has_text=LIVE).wait_for(timeout=max(left, 0) * 1000)
        assert time.monotonic() - running.committed["m-live"] <= 1.0
        await running.load_items()
        assert await line.locator("a").get_attribute("href") == f"/items/{running.id('m-live')}"
        assert not errors
        await page.close()


class TestActions:
    async def test_no_restart_control_unless_enabled_and_a_post_is_refused(self, running: Running) -> None:
        """No form or button says restart; a POST with this console's own CSRF token is still refused."""
        page, _ = await visit(running, "/")
        assert await page.get_by_role("button", name="restart").count() == 0
        assert await page.locator("form[action*=restart]").count() == 0
        await page.close()
        before = running.host.connectors["evil"].statistics().restarts
        console = running.host.console
        assert console is not None
        body = f"csrf={console.gate.open_csrf}"
        status, _, answer = await raw_http(running.address, "POST /connectors/evil/restart HTTP/1.1\r\n"
                                           f"Host: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                                           f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}")
        assert status == 403 and b"not enabled" in answer
        assert running.host.connectors["evil"].statistics().restarts == before


class TestExplain:
    async def test_the_timeline_agrees_with_explain_json(self, running: Running) -> None:
        """For a woken, a held and a not-waking item, each agent's section says what `mcplhost explain --json`
        says: one decision word, the reason, the turn, its publishes and drafts."""
        db, config = running.folder / "host.db", running.folder / "mcplhost.toml"
        decisions = {}
        page = await running.browser.new_page()
        errors = listen(page)
        for message_id in ("m-woken", "m-held", "m-quiet"):
            item = running.id(message_id)
            out = cli("explain", "--db", str(db), str(item), "--config", str(config), "--json")
            assert out.returncode == 0, out.stderr
            expected = [json.loads(line) for line in out.stdout.splitlines()]
            await page.goto(f"{running.url}/items/{item}")
            for answer in expected:
                section = page.locator(f"section.agent-explain[data-agent={answer['agent']}]")
                words = await section.locator(".decision").all_text_contents()
                assert words == [answer["decision"]]
                reason = await section.locator(".reason").all_text_contents()
                assert reason == ([f"({answer['reason']})"] if answer["reason"] else [])
                turns = await section.locator("li.turn").evaluate_all("els => els.map(e => e.dataset.turn)")
                assert turns == ([str(answer["turn"]["id"])] if answer["turn"] else [])
                if answer["turn"]:
                    outcome = await section.locator("li.turn .outcome").text_content()
                    assert outcome == (answer["turn"]["outcome"] or "running")
                publishes = await section.locator("li.publish").evaluate_all(
                    "els => els.map(e => [Number(e.dataset.outbox), e.querySelector('.fate').textContent])")
                assert publishes == [[p["outboxId"], p["state"]] for p in answer["publishes"]]
                drafts = await section.locator("li.draft").evaluate_all("els => els.map(e => Number(e.dataset.draft))")
                assert drafts == [d["id"] for d in answer["drafts"]]
                decisions[message_id] = answer["decision"]
        assert not errors
        await page.close()
        assert decisions == {"m-woken": "woke", "m-held": "held", "m-quiet": "not_waking"}
