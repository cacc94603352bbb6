"""The console as a host component: checked and built with the host, bound before it runs, served in its task group.

    token = console_token(config.console)             # ConsoleUnavailable: it cannot be served; first of all
    console = Console(config.console, token=token, store_path=..., secrets=store.secrets, operated=control,
                      agents=lambda: runtime.config.agents, lines=feed_format)
    address = console.bind()                          # before anything starts
    await tg.start(console.run)                       # until cancelled

Served by Hypercorn on the daemon's own event loop (`hypercorn.asyncio.serve`
with a shutdown trigger, so it installs no signal handler of its own: the
host's signals stay the host's), on the socket `bind` made. When the host
stops, the trigger fires and Hypercorn closes the listener and gives open
connections SHUTDOWN_GRACE_S (server.py), all inside the host's stop. The
console is a boundary: should its server or its feed fail, that is logged
once and the console stops serving; the daemon goes on.

The web packages (Starlette, Hypercorn, Jinja2) are the optional extra
`console`: they are imported only when the console is configured, and their
absence is one clear line at start (`ConsoleUnavailable`).
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import structlog
from anyio.abc import TaskStatus

from mcplhost import logs
from mcplhost.config import AgentConfig, ConsoleConfig, is_loopback, listen_address
from mcplhost.envfile import EnvFileError, read_token_file
from mcplhost.errors import HostStateError, OperatorError
from mcplhost.secrets import Secrets
from mcplhost.store import NewItem, open_reader

from .access import Gate
from .feed import Feed, FeedFormat
from .views import Operated, Views

log = structlog.get_logger()

#: The distributions the console needs (the extra `console` in pyproject.toml), by the module each provides.
WEB_MODULES = ("starlette", "hypercorn", "jinja2")
#: Pending connections the kernel holds for the console (the socket is bound here, before Hypercorn serves it).
BACKLOG = 64
#: The token's name where it is redacted (logs, stored rows, pages): it is a secret like any other.
TOKEN_SECRET = "console.token_file"


class ConsoleUnavailable(OperatorError):
    """`[console] listen` is set, but the console cannot be served (its packages, its token, its address)."""


def web_packages_missing() -> list[str]:
    """The console's packages that cannot be imported here."""
    return [name for name in WEB_MODULES if importlib.util.find_spec(name) is None]


def console_token(settings: ConsoleConfig) -> str | None:
    """The token visitors sign in with (None: no sign-in), once the console is known to be servable here.

    The host asks before it builds anything else: ConsoleUnavailable when a
    web package is missing, or the token file is refused as check-config
    refuses it.
    """
    missing = web_packages_missing()
    if missing:
        raise ConsoleUnavailable(f"console.listen is set, but {', '.join(missing)} is not installed",
                                 "install the console's packages: pip install 'mcplhost[console]'")
    host, _port = listen_address(settings.listen or "")
    if settings.token_file is None:
        if not is_loopback(host):
            raise ConsoleUnavailable(f"console.token_file: required when console.listen ({settings.listen}) is not "
                                     "a loopback address", "set [console] token_file, or listen on 127.0.0.1")
        return None
    try:
        return read_token_file(settings.token_file)
    except EnvFileError as exc:
        raise ConsoleUnavailable(f"console.token_file: {exc}") from None


class Console:
    """The web console of one host (docs/operations.md#console)."""

    def __init__(self, settings: ConsoleConfig, *, token: str | None, store_path: Path | str, secrets: Secrets,
                 operated: Operated, agents: Callable[[], Sequence[AgentConfig]], lines: FeedFormat,
                 connectors: Sequence[str] = ()) -> None:
        self.settings = settings
        host, _port = listen_address(settings.listen or "")
        self.loopback = is_loopback(host)
        if token is None and not self.loopback:
            raise ConsoleUnavailable("a console off loopback needs its token (console_token)")
        if token is not None:
            secrets.update({TOKEN_SECRET: token})  # never in a log line, a stored row or a page
        self.gate = Gate(token)
        self.store_path = store_path  # what its reader opens: the SQLite file, or the PostgreSQL URL
        self.secrets = secrets
        self.operated = operated
        self.agents = agents
        self.feed = Feed(lines)
        self.feed.connectors = list(connectors)  # as dev's `ready` line names them
        self.address: str | None = None  # HOST:PORT once bound
        self._socket: socket.socket | None = None

    def stored(self, items: list[NewItem]) -> None:
        """The host's on_stored hook (after each commit)."""
        self.feed.stored(items)

    def bind(self) -> str:
        """Bind and listen on `[console] listen` (port 0: a free one); HOST:PORT bound. Refused in one line."""
        host, port = listen_address(self.settings.listen or "")
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, kind, proto, _name, address = infos[0]
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(address)
                sock.listen(BACKLOG)
            except OSError:
                sock.close()
                raise
        except OSError as exc:
            raise ConsoleUnavailable(f"console.listen: cannot listen on {self.settings.listen}: {exc.strerror or exc}",
                                     "choose a free address in [console] listen, or remove it") from None
        self._socket = sock
        bound_host, bound_port = sock.getsockname()[:2]
        self.address = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"
        log.info("console.listening", address=self.address, signin=self.gate.required,
                 actions=list(self.settings.actions))
        return self.address

    def close(self) -> None:
        """Close the listening socket (the host does, whether the console ran or not)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled. Started at once: the socket listens since `bind`, so a first visitor's
        connection waits in the backlog until Hypercorn takes it."""
        if self._socket is None:
            raise HostStateError("the console was not bound before it ran")
        # The web packages, imported here: only a host with [console] listen needs them (module docstring).
        from hypercorn.asyncio import serve

        from .app import Pages, build_app
        from .server import SHUTDOWN_GRACE_S, server_config

        # Hypercorn takes its own descriptor of the socket, and closes that one; `close` closes ours.
        settings = server_config(os.dup(self._socket.fileno()))
        async with open_reader(self.store_path) as reads, anyio.create_task_group() as tg:
            views = Views(reads, self.operated, self.agents)
            pages = Pages(views, self.feed, self.gate, self.secrets, actions=frozenset(self.settings.actions))
            app = build_app(pages, loopback=self.loopback)
            tg.start_soon(_boundary, "feed", self.feed.run, reads.items)
            stop = anyio.Event()
            shielded = anyio.CancelScope(shield=True)

            async def server() -> None:
                with shielded:  # its own graceful stop below, bounded, not a cancellation mid-write
                    # Starlette types an ASGI app's scope as a MutableMapping, hypercorn as its TypedDicts:
                    # the same callable, described two ways that do not unify.
                    await serve(app, settings, shutdown_trigger=stop.wait,  # type: ignore[arg-type]
                                mode="asgi")

            with logs.tapping(self.feed.event):
                tg.start_soon(_boundary, "server", server)
                task_status.started()
                try:
                    await anyio.sleep_forever()
                finally:
                    stop.set()
                    shielded.deadline = anyio.current_time() + SHUTDOWN_GRACE_S * 3
                    tg.cancel_scope.cancel()


async def _boundary(part: str, run: Callable[..., Awaitable[None]], *args: object) -> None:
    """Run one part of the console; its failure is logged once and ends that part only, never the daemon."""
    try:
        await run(*args)
    except Exception:  # the boundary: the console is an operator's window, not something the host needs
        log.error("console.failed", part=part, exc_info=True)
