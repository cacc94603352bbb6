"""The console's pages and live streams: a Starlette app over `Views`, Jinja2 templates, server-sent events.

Templates autoescape everything, and every value they print passes
`Pages.finalize` first, which redacts the host's secrets
(mcplhost/secrets.py): what a connector, a chat user or a model wrote
reaches the page as text, never as markup and never with a token in it.
The only script is /static/console.js; it builds the live lines with
`textContent`. Paths are the public surface a visitor follows from `/`
(docs/operations.md#console).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import jinja2
import structlog
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from mcplhost.config import CONSOLE_ACTIONS
from mcplhost.control.wire import RestartRequest
from mcplhost.inbound.notice import reader_text
from mcplhost.secrets import Secrets
from mcplhost.store import StoredItem, Turn
from mcplhost.store.items import CONSOLE_WINDOW_ROWS
from mcplhost.store.turns import spent_tokens

from .access import Gate, SigninLimiter, cleared_cookie, session_cookie
from .feed import Feed
from .guard import Guard, session_id
from .streams import FeedEvents, StatusEvents
from .views import Views, clock

log = structlog.get_logger()

#: What a form field may hold at most (the token, a CSRF token); longer is refused unread.
MAX_FIELD_CHARS = 4096
#: Characters of a body a list row shows (its page has all of it).
BODY_CHARS = 300
#: The restart action's name in `[console] actions`.
RESTART = CONSOLE_ACTIONS[0]


def _when(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_ms / 1000))


def _ago(epoch_ms: int | None) -> str:
    """How long ago, at a glance (12s ago, 5m ago, 3h ago, 2d ago); never for None."""
    if epoch_ms is None:
        return "never"
    seconds = max(int(time.time() * 1000) - epoch_ms, 0) // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _field(value: Any, key: str) -> str:
    """A status field's value as the overview shows it: times as "ago", lists joined, null as a dash."""
    if value is None:
        return "never" if key.endswith("At") else "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key.endswith("At") and isinstance(value, int):
        return _ago(value)
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "–"
    return str(value)


def _body(item: StoredItem) -> str:
    """An item's body (its header left out) on one line, cut to BODY_CHARS: what a list row shows of it."""
    text = " ⏎ ".join(reader_text(item.content, item.meta.source_header).split("\n"))
    return text if len(text) <= BODY_CHARS else text[: BODY_CHARS - 1] + "…"


def _label(item: StoredItem) -> str | None:
    source = item.meta.source
    return source.label if source is not None else None


def _tokens(turn: Turn) -> str:
    return "–" if turn.usage is None else str(spent_tokens(turn.usage))


def _form(body: bytes) -> dict[str, str]:
    """An urlencoded form's fields (the first value of each), each cut at MAX_FIELD_CHARS."""
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=16)
    return {key: values[0][:MAX_FIELD_CHARS] for key, values in fields.items() if values}


class Pages:
    """The routes' handlers; each renders one template with what `Views` read."""

    def __init__(self, views: Views, feed: Feed, gate: Gate, secrets: Secrets, *, actions: frozenset[str],
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self.views = views
        self.feed = feed
        self.gate = gate
        self.secrets = secrets
        self.actions = actions
        self.clock_s = clock_s
        self.signins = SigninLimiter()
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("mcplhost.console", "templates"), autoescape=True,
            undefined=jinja2.StrictUndefined, finalize=self.finalize, trim_blocks=True, lstrip_blocks=True)
        self.env.filters.update(clock=clock, when=_when, ago=_ago, field=_field, body=_body, label=_label,
                                tokens=_tokens)

    def finalize(self, value: Any) -> Any:
        """Every printed value: a string with the secrets redacted (markup the templates made is left as it is)."""
        if isinstance(value, str) and not isinstance(value, Markup) and self.secrets:
            return self.secrets.redact(value)
        return value

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        sid = session_id(request.scope)
        now = self.clock_s()
        html = self.env.get_template(name).render(
            request=request, signed_in=self.gate.required and self.gate.session(sid, now) is not None,
            csrf=self.gate.csrf_for(sid, now), restart_enabled=RESTART in self.actions, **context)
        return HTMLResponse(html, status_code=status)

    # --- pages -------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        view = await self.views.overview()
        names = {c["name"] for c in view.status.get("connectors", [])}
        restarted = request.query_params.get("restarted")
        return self.render(request, "overview.html", title="Overview", view=view,
                           restarted=restarted if restarted in names else None)

    async def feed_page(self, request: Request) -> Response:
        lines = self.feed.lines()
        return self.render(request, "feed.html", title="Live feed", lines=list(reversed(lines)),
                           last_seq=lines[-1].seq if lines else 0)

    async def item(self, request: Request) -> Response:
        view = await self.views.item(request.path_params["item_id"])
        if view is None:
            raise HTTPException(404, f"no item {request.path_params['item_id']}")
        return self.render(request, "item.html", title=f"Item {view.item.id}", view=view)

    async def items(self, request: Request) -> Response:
        query = request.query_params
        before = _number(query.get("before"))
        rows = await self.views.items(connector=query.get("connector") or None, channel=query.get("channel") or None,
                                      before=before)
        return self.render(request, "items.html", title="Messages", rows=rows, connector=query.get("connector"),
                           channel=query.get("channel"), before=before,
                           further=max((before or 0) - CONSOLE_WINDOW_ROWS, 1))

    async def turn(self, request: Request) -> Response:
        view = await self.views.turn(request.path_params["turn_id"])
        if view is None:
            raise HTTPException(404, f"no turn {request.path_params['turn_id']}")
        return self.render(request, "turn.html", title=f"Turn {view.turn.id}", view=view)

    async def turns(self, request: Request) -> Response:
        agent = request.query_params.get("agent") or None
        return self.render(request, "turns.html", title="Turns", agent=agent, turns=await self.views.turns(agent))

    async def outbox(self, request: Request) -> Response:
        agent = request.query_params.get("agent") or None
        return self.render(request, "outbox.html", title="Outbox", agent=agent, rows=await self.views.outbox(agent))

    async def publish(self, request: Request) -> Response:
        row = await self.views.publish(request.path_params["outbox_id"])
        if row is None:
            raise HTTPException(404, f"no publish {request.path_params['outbox_id']}")
        target = f"/turns/{row.turn_id}#publish-{row.id}" if row.turn_id is not None else "/outbox"
        return RedirectResponse(target, status_code=303)

    async def drafts(self, request: Request) -> Response:
        agent = request.query_params.get("agent") or None
        return self.render(request, "drafts.html", title="Drafts", agent=agent, drafts=await self.views.drafts(agent))

    async def search(self, request: Request) -> Response:
        query = request.query_params
        text = query.get("q", "")
        as_regex, ignore_case = query.get("regex") == "1", query.get("case") == "1"
        found = await self.views.search(text, as_regex=as_regex, ignore_case=ignore_case) if text else None
        return self.render(request, "search.html", title="Search", q=text, regex=as_regex, case=ignore_case,
                           found=found)

    # --- signing in, and the one action ----------------------------------------------------

    async def signin_page(self, request: Request) -> Response:
        if not self.gate.required:
            return RedirectResponse("/", status_code=303)
        return self.render(request, "signin.html", title="Sign in", wrong=False)

    async def signin(self, request: Request) -> Response:
        if not self.gate.required:
            return RedirectResponse("/", status_code=303)
        now = self.clock_s()
        if not self.signins.open(now):
            return self.render(request, "signin.html", 429, title="Sign in", wrong=False, busy=True)
        session = self.gate.sign_in(_form(await request.body()).get("token", ""), now)
        if session is None:
            self.signins.failed(now)
            log.info("console.signin_refused")  # never what was given
            return self.render(request, "signin.html", 403, title="Sign in", wrong=True)
        log.info("console.signed_in")
        return RedirectResponse("/", status_code=303, headers={"set-cookie": session_cookie(session)})

    async def signout(self, request: Request) -> Response:
        sid = session_id(request.scope)
        if not self._form_ok(request, _form(await request.body())):
            return self.render(request, "error.html", 403, title="Refused", message="the form is not this console's")
        self.gate.sign_out(sid)
        return RedirectResponse("/signin", status_code=303, headers={"set-cookie": cleared_cookie()})

    async def restart(self, request: Request) -> Response:
        name = request.path_params["name"]
        if RESTART not in self.actions:
            return self.render(request, "error.html", 403, title="Refused",
                               message=f"{RESTART} is not enabled in [console] actions")
        if not self._form_ok(request, _form(await request.body())):
            return self.render(request, "error.html", 403, title="Refused", message="the form is not this console's")
        answer = await self.views.operated.answer(RestartRequest(name=name))  # what `restart-connector` asks
        if not answer.ok:
            return self.render(request, "error.html", 409, title="Not restarted", message=answer.error or "")
        log.info("console.restart_connector", connector=name)
        return RedirectResponse(f"/?restarted={name}", status_code=303)

    def _form_ok(self, request: Request, form: dict[str, str]) -> bool:
        """The form carries this visitor's CSRF token and, when the browser says, comes from this origin."""
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host', '')}":
            return False
        return self.gate.csrf_ok(session_id(request.scope), form.get("csrf", ""), self.clock_s())

    async def not_found(self, request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "error"
        return self.render(request, "error.html", status, title="Not found" if status == 404 else "Error",
                           message=detail)


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() and len(text) < 19 else None


def build_app(pages: Pages, *, loopback: bool) -> ASGIApp:
    """The whole console as one ASGI app: the routes inside the Guard (mcplhost/console/guard.py)."""
    feed_events = FeedEvents(pages.feed, pages.secrets)
    status_events = StatusEvents(pages.views, pages.secrets)
    routes = [
        Route("/", pages.overview),
        Route("/feed", pages.feed_page),
        Route("/feed/events", feed_events),
        Route("/status/events", status_events),
        Route("/items", pages.items),
        Route("/items/{item_id:int}", pages.item),
        Route("/turns", pages.turns),
        Route("/turns/{turn_id:int}", pages.turn),
        Route("/outbox", pages.outbox),
        Route("/outbox/{outbox_id:int}", pages.publish),
        Route("/drafts", pages.drafts),
        Route("/search", pages.search),
        Route("/signin", pages.signin_page, methods=["GET"]),
        Route("/signin", pages.signin, methods=["POST"]),
        Route("/signout", pages.signout, methods=["POST"]),
        Route("/connectors/{name}/restart", pages.restart, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("mcplhost.console", "static")]), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: pages.not_found})
    return Guard(app, pages.gate, loopback=loopback, clock=pages.clock_s)
